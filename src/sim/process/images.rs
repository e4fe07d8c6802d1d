//! The image table: what an image stands for on this machine. Images are not
//! pulled; the embedding program says which local programs an image runs
//! (pgfleet maps `postgres:*` to an installed PostgreSQL and `*pgbouncer*`
//! to PgBouncer), and an image no rule matches runs its command as given with
//! the host's tools. The emulator itself knows no image.

use std::path::{Path, PathBuf};

/// Which images a rule covers.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageMatch {
    /// The repository's last path segment, without tag or digest
    /// (`docker.io/library/postgres:15` is `postgres`).
    Repository(String),
    /// Any image reference containing this text.
    Contains(String),
}

/// Where an image's programs live on this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct BinDir {
    /// A directory template; `{major}` stands for the tag's major version
    /// (`15.4-bookworm` → `15`), e.g. `/usr/lib/postgresql/{major}/bin`.
    pub template: String,
    /// Majors tried, in order, when the tag names none or one that is not
    /// installed; then the newest installed major (a numeric directory where
    /// `{major}` sits). The first one is used when nothing is installed.
    pub fallback_majors: Vec<String>,
}

/// How the process runtime runs the containers of matching images.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageRule {
    pub image: ImageMatch,
    /// The image's main program: a name looked up in `bin_dir` (and on PATH),
    /// or an absolute path (a container command naming a program of the same
    /// file name then runs this one).
    pub program: String,
    /// Put first on the container's PATH; an installed major is one whose
    /// directory holds `program`.
    pub bin_dir: Option<BinDir>,
    /// Arguments when the container gives neither `command` nor `args`.
    pub default_args: Vec<String>,
    /// The image's own environment (its `ENV` lines), before the pod's.
    pub env: Vec<(String, String)>,
}

/// A rule resolved for one image.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResolvedImage {
    pub bin_dir: Option<PathBuf>,
    pub program: Option<String>,
    pub default_args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// The repository part of an image reference: `docker.io/library/postgres:15` → `postgres`.
pub fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    last.split(':').next().unwrap_or(last)
}

/// The tag's major version (`15.4-bookworm` → `15`).
pub fn major(image: &str) -> Option<String> {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    let tag = last.split_once(':')?.1;
    let m: String = tag.chars().take_while(char::is_ascii_digit).collect();
    (!m.is_empty()).then_some(m)
}

impl ImageMatch {
    fn matches(&self, image: &str) -> bool {
        match self {
            ImageMatch::Repository(r) => repository(image) == r,
            ImageMatch::Contains(s) => image.contains(s.as_str()),
        }
    }
}

impl BinDir {
    fn with_major(&self, major: &str) -> PathBuf {
        PathBuf::from(self.template.replace("{major}", major))
    }

    /// The installed majors, newest last: numeric directories where the
    /// template has `{major}`.
    fn installed(&self) -> Vec<u32> {
        let Some((root, _)) = self.template.split_once("{major}") else {
            return vec![];
        };
        let mut found: Vec<u32> = std::fs::read_dir(Path::new(root))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        found.sort_unstable();
        found
    }

    /// The directory for an image: the tag's major if installed, else the
    /// fallbacks, else the newest installed, else the first fallback.
    fn resolve(&self, image: &str, program: &str) -> PathBuf {
        let has = |d: &PathBuf| d.join(program).exists();
        let wanted = major(image).into_iter().chain(self.fallback_majors.clone());
        if let Some(d) = wanted.map(|m| self.with_major(&m)).find(has) {
            return d;
        }
        let newest = self
            .installed()
            .last()
            .map(|v| self.with_major(&v.to_string()));
        let first = self.fallback_majors.first().map(|m| self.with_major(m));
        newest
            .or(first)
            .unwrap_or_else(|| PathBuf::from(&self.template))
    }
}

/// The first rule matching `image`, resolved; the default (run the command
/// as given) when none does.
pub fn resolve(rules: &[ImageRule], image: &str) -> ResolvedImage {
    let Some(rule) = rules.iter().find(|r| r.image.matches(image)) else {
        return ResolvedImage::default();
    };
    ResolvedImage {
        bin_dir: rule
            .bin_dir
            .as_ref()
            .map(|b| b.resolve(image, &rule.program)),
        program: Some(rule.program.clone()),
        default_args: rule.default_args.clone(),
        env: rule.env.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rules(root: &Path) -> Vec<ImageRule> {
        vec![
            ImageRule {
                image: ImageMatch::Repository("db".into()),
                program: "db".into(),
                bin_dir: Some(BinDir {
                    template: format!("{}/{{major}}/bin", root.display()),
                    fallback_majors: vec!["2".into()],
                }),
                default_args: vec![],
                env: vec![("DATA".into(), "/data".into())],
            },
            ImageRule {
                image: ImageMatch::Contains("proxy".into()),
                program: "/usr/sbin/proxy".into(),
                bin_dir: None,
                default_args: vec!["/etc/proxy.ini".into()],
                env: vec![],
            },
        ]
    }

    #[test]
    fn images_map_to_local_programs() {
        let root = std::env::temp_dir().join(format!("pgfleet-sim-images-{}", std::process::id()));
        for m in ["3", "5"] {
            std::fs::create_dir_all(root.join(m).join("bin")).unwrap();
            std::fs::write(root.join(m).join("bin/db"), "").unwrap();
        }
        let rules = rules(&root);
        assert_eq!(repository("docker.io/library/db:15.4"), "db");
        assert_eq!(major("db:15.4-bookworm").as_deref(), Some("15"));
        let bin = |image: &str| resolve(&rules, image).bin_dir.unwrap();
        assert_eq!(bin("db:3.1"), root.join("3/bin"), "the tag's major");
        assert_eq!(bin("db:9"), root.join("5/bin"), "not installed: newest");
        assert_eq!(
            resolve(&rules, "db:3").env,
            vec![("DATA".into(), "/data".into())]
        );
        let proxy = resolve(&rules, "example/proxy:1");
        assert_eq!(proxy.program.as_deref(), Some("/usr/sbin/proxy"));
        assert_eq!(proxy.bin_dir, None);
        assert_eq!(resolve(&rules, "busybox:1"), ResolvedImage::default());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
