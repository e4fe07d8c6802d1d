//! `/usr/bin/kubectl` bound to one sim's kubeconfig, with a private
//! discovery cache (the kubectl tests of this crate share it).

use super::TestSim;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const KUBECTL: &str = "/usr/bin/kubectl";

pub struct Kubectl {
    pub kubeconfig: PathBuf,
    pub cache: PathBuf,
    pub dir: PathBuf,
}

impl Kubectl {
    pub fn new(s: &TestSim) -> Kubectl {
        assert!(
            Path::new(KUBECTL).exists(),
            "kubectl is not installed at {KUBECTL}; these tests drive the real kubectl client. \
             Install it (e.g. from https://dl.k8s.io/release/<version>/bin/linux/amd64/kubectl) and re-run."
        );
        Kubectl {
            kubeconfig: s.kubeconfig().to_path_buf(),
            cache: s.dir.join("kubectl-cache"),
            dir: s.dir.clone(),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(KUBECTL);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args)
            .output()
            .unwrap_or_else(|e| panic!("running {KUBECTL}: {e}"))
    }

    /// Runs kubectl, asserts success, returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {} failed ({}):\nstdout: {}\nstderr: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs kubectl, asserts failure, returns (exit code, stderr).
    pub fn fails(&self, args: &[&str]) -> (i32, String) {
        let out = self.run(args);
        assert!(
            !out.status.success(),
            "kubectl {} should have failed; stdout: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        );
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stderr).unwrap(),
        )
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }

    /// Writes `content` to a file in the sim directory and returns its path.
    pub fn file(&self, name: &str, content: &str) -> String {
        let p = self.dir.join(name);
        std::fs::write(&p, content).unwrap();
        p.to_string_lossy().into_owned()
    }

    /// `kubectl apply -f` of `yaml`, written to a file named `name`.
    pub fn apply(&self, name: &str, yaml: &str) {
        let p = self.file(name, yaml);
        self.ok(&["apply", "-f", &p]);
    }
}
