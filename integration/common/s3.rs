//! A real S3-compatible object store on loopback for the backup tests: moto
//! behind `integration/s3server.py` (TLS with a fresh self-signed
//! certificate, clean TLS shutdown for pgBackRest), driven over HTTPS with
//! curl. Stopping it loses its data, like an object store that is gone.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BUCKET: &str = "pgbackrest";

pub struct S3 {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl S3 {
    /// Starts the server (certificate in `dir`) and creates the bucket.
    pub fn start(dir: &Path) -> S3 {
        std::fs::create_dir_all(dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join("s3.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("s3.key"), key.serialize_pem()).unwrap();
        let mut s3 = S3 {
            port: free_port(),
            dir: dir.to_path_buf(),
            child: None,
        };
        s3.resume();
        s3
    }

    pub fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// `[backups]` TOML for this store, credentials in Secret `backup-creds`.
    pub fn backups_toml(&self) -> String {
        format!(
            "[backups]\nwindow = \"1m\"\nrepository = {{ s3 = {{ bucket = \"{BUCKET}\", endpoint = \"{}\", region = \"us-east-1\", uri_style = \"path\", verify_tls = false, path_prefix = \"fleet\", credentials_secret = \"backup-creds\" }} }}\n",
            self.endpoint()
        )
    }

    fn curl(&self, args: &[&str]) -> std::process::Output {
        Command::new("curl")
            .args(["-sk", "--max-time", "10"])
            .args(args)
            .output()
            .unwrap()
    }

    /// The store goes away (and forgets everything, as moto keeps it in memory).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts (again) on the same port, with an empty bucket.
    pub fn resume(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("integration/s3server.py");
        let log = std::fs::File::create(self.dir.join("s3.log")).unwrap();
        let child = Command::new("python3")
            .arg(script)
            .arg("127.0.0.1")
            .arg(self.port.to_string())
            .arg(self.dir.join("s3.crt"))
            .arg(self.dir.join("s3.key"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting the S3 server (python3 with moto[server])");
        self.child = Some(child);
        let start = Instant::now();
        let url = format!("{}/{BUCKET}", self.endpoint());
        loop {
            let out = self.curl(&["-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT", &url]);
            if String::from_utf8_lossy(&out.stdout).starts_with('2') {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the S3 server did not come up: {}",
                std::fs::read_to_string(self.dir.join("s3.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Object keys under `prefix`.
    pub fn list(&self, prefix: &str) -> Vec<String> {
        let url = format!("{}/{BUCKET}?list-type=2&prefix={prefix}", self.endpoint());
        let out = String::from_utf8_lossy(&self.curl(&[&url]).stdout).to_string();
        out.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next())
            .map(String::from)
            .collect()
    }

    /// Deletes one object (signed: moto refuses anonymous deletes).
    pub fn delete(&self, key: &str) {
        let url = format!("{}/{BUCKET}/{key}", self.endpoint());
        let out = self.curl(&[
            "--aws-sigv4",
            "aws:amz:us-east-1:s3",
            "--user",
            "test-key:test-secret",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "DELETE",
            &url,
        ]);
        let code = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(code.starts_with('2'), "DELETE {key}: HTTP {code}");
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        self.stop();
    }
}
