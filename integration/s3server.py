"""moto's S3 on https://HOST:PORT, closing TLS connections cleanly.

`moto_server --ssl-cert/--ssl-key` (werkzeug's dev server) answers every
request with `Connection: close` and then drops the TCP connection without a
TLS close_notify; pgBackRest (OpenSSL 3) reads such a response to EOF and fails
with "TLS error [1:167772454] unexpected eof while reading" (retrying until
io-timeout). This launcher sends the close_notify before closing.

usage: python3 s3server.py HOST PORT CERT KEY
"""
import sys

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import WSGIRequestHandler, run_simple


class Handler(WSGIRequestHandler):
    def finish(self):
        super().finish()
        try:
            self.connection.settimeout(2)
            self.connection.unwrap()  # SSL_shutdown: send close_notify
        except Exception:
            pass


host, port, cert, key = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
app = DomainDispatcherApplication(create_backend_app)
run_simple(host, port, app, threaded=True, ssl_context=(cert, key), request_handler=Handler)
