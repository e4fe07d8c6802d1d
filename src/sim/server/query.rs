//! Query-string parameters of Kubernetes API requests. Parsed by hand because
//! some repeat (`command` of exec) and most are optional strings.

use std::collections::HashMap;

#[derive(Debug, Default, Clone)]
pub struct Query {
    single: HashMap<String, String>,
    multi: HashMap<String, Vec<String>>,
}

impl Query {
    pub fn parse(q: Option<&str>) -> Self {
        let mut out = Query::default();
        for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
            out.multi
                .entry(k.to_string())
                .or_default()
                .push(v.to_string());
            out.single.insert(k.to_string(), v.to_string());
        }
        out
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.single
            .get(k)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    pub fn all(&self, k: &str) -> Vec<String> {
        self.multi.get(k).cloned().unwrap_or_default()
    }

    pub fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }

    pub fn int(&self, k: &str) -> Option<i64> {
        self.get(k).and_then(|s| s.parse().ok())
    }
}
