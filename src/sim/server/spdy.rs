//! SPDY/3.1 framing, the part Kubernetes streaming uses (`pods/portforward`
//! as kubectl speaks it: over an HTTP `Upgrade: SPDY/3.1`, or tunnelled in
//! WebSocket binary messages with the `SPDY/3.1+portforward.k8s.io`
//! subprotocol). Only the server side: the client opens every stream.
//!
//! Frames are 8 bytes of header and a payload. Header blocks are zlib
//! compressed as one stream per direction, the client's with the preset
//! dictionary of the SPDY/3 specification (§2.6.10.1); ours go out without
//! a dictionary, which a zlib reader accepts. Flow control is not enforced by
//! Kubernetes' SPDY library, so WINDOW_UPDATE frames are read and ignored.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use std::collections::HashMap;
use std::sync::OnceLock;
use tokio::io::{AsyncRead, AsyncReadExt};

pub const SYN_STREAM: u16 = 1;
pub const SYN_REPLY: u16 = 2;
pub const RST_STREAM: u16 = 3;
pub const PING: u16 = 6;
pub const GOAWAY: u16 = 7;
pub const FLAG_FIN: u8 = 0x01;

/// One frame as read from the wire.
#[derive(Debug)]
pub enum Frame {
    Control {
        kind: u16,
        data: Vec<u8>,
    },
    Data {
        stream: u32,
        flags: u8,
        data: Vec<u8>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("reading a SPDY frame: {0}")]
    Io(#[from] std::io::Error),
    #[error("SPDY frame of version {0}, only 3 is spoken")]
    Version(u16),
    #[error("SPDY header block: {0}")]
    Headers(String),
}

/// Reads the next frame; `Ok(None)` at a clean end of the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, SpdyError> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let flags = head[4];
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    let mut data = vec![0u8; len];
    r.read_exact(&mut data).await?;
    let word = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    if word & 0x8000_0000 != 0 {
        let version = ((word >> 16) & 0x7fff) as u16;
        if version != 3 {
            return Err(SpdyError::Version(version));
        }
        Ok(Some(Frame::Control {
            kind: (word & 0xffff) as u16,
            data,
        }))
    } else {
        Ok(Some(Frame::Data {
            stream: word,
            flags,
            data,
        }))
    }
}

fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(0x8003_0000u32 | u32::from(kind)).to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// A DATA frame (payloads are chunked by the caller below 16 MiB).
pub fn data_frame(stream: u32, fin: bool, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.push(if fin { FLAG_FIN } else { 0 });
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// The answer to a PING: the same frame back.
pub fn ping_frame(payload: &[u8]) -> Vec<u8> {
    control(PING, 0, payload)
}

/// The stream id a SYN_STREAM, SYN_REPLY or RST_STREAM payload starts with.
pub fn stream_id(payload: &[u8]) -> Option<u32> {
    let b: [u8; 4] = payload.get(..4)?.try_into().ok()?;
    Some(u32::from_be_bytes(b) & 0x7fff_ffff)
}

/// The zlib state of one connection: the client's header stream and ours.
pub struct Headers {
    inflate: Decompress,
    deflate: Compress,
}

impl Default for Headers {
    fn default() -> Self {
        Headers {
            inflate: Decompress::new(true),
            deflate: Compress::new(Compression::default(), true),
        }
    }
}

impl Headers {
    /// The headers of a SYN_STREAM payload (names lower case, as SPDY sends them).
    pub fn syn_stream(&mut self, payload: &[u8]) -> Result<HashMap<String, String>, SpdyError> {
        let block = payload
            .get(10..)
            .ok_or_else(|| SpdyError::Headers("SYN_STREAM shorter than 10 bytes".into()))?;
        let raw = self.inflate_block(block)?;
        parse_block(&raw)
    }

    /// A SYN_REPLY for `stream` with no headers.
    pub fn syn_reply(&mut self, stream: u32) -> Result<Vec<u8>, SpdyError> {
        let mut p = stream.to_be_bytes().to_vec();
        p.extend_from_slice(&self.deflate_block(&0u32.to_be_bytes())?);
        Ok(control(SYN_REPLY, 0, &p))
    }

    fn inflate_block(&mut self, mut input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(256);
        let err = |e: String| SpdyError::Headers(e);
        while !input.is_empty() {
            out.reserve(1024);
            let before = self.inflate.total_in();
            match self
                .inflate
                .decompress_vec(input, &mut out, FlushDecompress::Sync)
            {
                Ok(Status::StreamEnd) => break,
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(dictionary())
                        .map_err(|e| err(format!("dictionary: {e}")))?;
                }
                Err(e) => return Err(err(e.to_string())),
            }
            let used = (self.inflate.total_in() - before) as usize;
            input = &input[used..];
            if used == 0 && out.len() < out.capacity() {
                break;
            }
        }
        Ok(out)
    }

    fn deflate_block(&mut self, raw: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(raw.len() + 64);
        let before = self.deflate.total_in();
        loop {
            let done = (self.deflate.total_in() - before) as usize;
            self.deflate
                .compress_vec(&raw[done..], &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Headers(e.to_string()))?;
            if (self.deflate.total_in() - before) as usize == raw.len()
                && out.len() < out.capacity()
            {
                return Ok(out);
            }
            out.reserve(256);
        }
    }
}

fn be32(b: &[u8], at: usize) -> Result<usize, SpdyError> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(|a: [u8; 4]| u32::from_be_bytes(a) as usize)
        .ok_or_else(|| SpdyError::Headers("header block ends early".into()))
}

/// `count, (name length, name, value length, value)*`, big-endian u32s.
fn parse_block(b: &[u8]) -> Result<HashMap<String, String>, SpdyError> {
    let n = be32(b, 0)?;
    let mut at = 4;
    let mut out = HashMap::new();
    let take = |at: &mut usize| -> Result<String, SpdyError> {
        let len = be32(b, *at)?;
        let s = b
            .get(*at + 4..*at + 4 + len)
            .ok_or_else(|| SpdyError::Headers("header block ends early".into()))?;
        *at += 4 + len;
        Ok(String::from_utf8_lossy(s).into_owned())
    };
    for _ in 0..n {
        let name = take(&mut at)?;
        let value = take(&mut at)?;
        out.insert(name.to_ascii_lowercase(), value);
    }
    Ok(out)
}

/// The header-compression dictionary of SPDY/3 (§2.6.10.1): each of these
/// words with a 4-byte big-endian length before it, then the tail as is.
pub fn dictionary() -> &'static [u8] {
    static DICT: OnceLock<Vec<u8>> = OnceLock::new();
    DICT.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = concat!(
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
            "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently",
            "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
            "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct ",
            "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,",
            "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,",
            "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8",
            "charset=iso-8859-1,utf-,*,enq=0."
        );
        let mut d = Vec::with_capacity(1500);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_has_the_specified_size() {
        // The SPDY/3 dictionary is 1423 bytes and ends with "enq=0.".
        assert_eq!(dictionary().len(), 1423);
        assert!(dictionary().ends_with(b"enq=0."));
    }

    #[test]
    fn header_blocks_round_trip_through_both_zlib_streams() {
        // A client compressing with the dictionary, as Go's SPDY framer does.
        let mut client = Compress::new(Compression::default(), true);
        client.set_dictionary(dictionary()).expect("dictionary");
        let mut raw = 2u32.to_be_bytes().to_vec();
        for (k, v) in [("streamtype", "data"), ("port", "5432")] {
            raw.extend_from_slice(&(k.len() as u32).to_be_bytes());
            raw.extend_from_slice(k.as_bytes());
            raw.extend_from_slice(&(v.len() as u32).to_be_bytes());
            raw.extend_from_slice(v.as_bytes());
        }
        let mut block = Vec::with_capacity(512);
        client
            .compress_vec(&raw, &mut block, FlushCompress::Sync)
            .expect("compress");
        let mut payload = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        payload.extend_from_slice(&block);
        let mut h = Headers::default();
        let got = h.syn_stream(&payload).expect("headers");
        assert_eq!(got.get("port").map(String::as_str), Some("5432"));
        assert_eq!(got.get("streamtype").map(String::as_str), Some("data"));
        let reply = h.syn_reply(1).expect("reply");
        let mut back = Decompress::new(true);
        let mut out = Vec::with_capacity(64);
        back.decompress_vec(&reply[12..], &mut out, FlushDecompress::Sync)
            .expect("inflate");
        assert_eq!(out, vec![0, 0, 0, 0]);
    }
}
