//! Property test: pgbackrest.conf renders a tenant's repository path on one
//! line, or the path is refused (the strings are the renderers' shared
//! `postgres::render_props::nasty`).
#![allow(clippy::unwrap_used)]

use super::repo::render_conf;
use crate::postgres::render_props::nasty;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn pgbackrest_conf_paths_are_one_line_or_refused(path in nasty()) {
        let repo = crate::config::backups::Repository::Filesystem { path: "/r".into() };
        let retention = crate::config::backups::Retention { count: Some(2), age: None };
        let baseline = render_conf(&repo, "/p", &retention, "/d", true).lines().count();
        if crate::postgres::quote::ini_refusal(&path).is_none() {
            let conf = render_conf(&repo, &path, &retention, "/d", true);
            prop_assert_eq!(conf.lines().count(), baseline);
            let expected = format!("repo1-path={path}");
            prop_assert_eq!(conf.lines().filter(|l| l.starts_with("repo1-path=")).collect::<Vec<_>>(), vec![expected.as_str()]);
        } else {
            prop_assert!(path.is_empty() || path.trim() != path || path.chars().any(char::is_control));
        }
    }
}
