//! kubectl (a real client no one here wrote) for the deploy test, with a
//! private discovery cache per kubeconfig.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const KUBECTL: &str = "/usr/bin/kubectl";

pub struct Kubectl {
    kubeconfig: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    pub fn new(kubeconfig: &Path, dir: &Path) -> Kubectl {
        assert!(
            Path::new(KUBECTL).exists(),
            "kubectl is not installed at {KUBECTL}"
        );
        Kubectl {
            kubeconfig: kubeconfig.to_path_buf(),
            dir: dir.to_path_buf(),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(
                self.dir
                    .join("kubectl-cache")
                    .join(self.kubeconfig.file_name().unwrap_or_default()),
            )
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {} failed:\nstdout: {}\nstderr: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn fails(&self, args: &[&str]) -> (i32, String) {
        let out = self.run(args);
        assert!(
            !out.status.success(),
            "kubectl {} should have failed",
            args.join(" ")
        );
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stderr).unwrap(),
        )
    }

    pub fn file(&self, name: &str, content: &str) -> String {
        let p = self.dir.join(name);
        std::fs::write(&p, content).unwrap();
        p.to_string_lossy().into_owned()
    }

    /// Runs a shell script with KUBECONFIG pointing at this kubeconfig.
    pub fn script(&self, script: &Path, args: &[&str]) -> String {
        let out = Command::new("sh")
            .arg(script)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECTL", KUBECTL)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}
