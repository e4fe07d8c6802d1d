//! Finds the line of a key path in TOML source text.
//!
//! Deserialization works on figment's merged value, which no longer knows
//! where anything came from. Errors must name a line, so this module scans
//! the source once and records the line of every header, key and array
//! element under its full path (`[[clusters]]` counted into `clusters[1]`).
//! The text has already been parsed successfully by the TOML parser, so the
//! scanner only has to be right for valid TOML; on anything surprising it
//! skips the rest of the line rather than failing.

use super::error::Seg;

/// Line numbers (1-based) for key paths in one TOML document.
#[derive(Debug, Default)]
pub(crate) struct LineIndex {
    entries: Vec<(Vec<Seg>, usize)>,
}

impl LineIndex {
    pub(crate) fn build(src: &str) -> Self {
        let mut s = Scanner {
            chars: src.chars().collect(),
            pos: 0,
            line: 1,
            out: Vec::new(),
        };
        s.document();
        Self { entries: s.out }
    }

    /// The line of `path`, or of its nearest enclosing entry (an inline
    /// table's line for a key inside it, a `[table]` header for a key that is
    /// missing from it). `None` when nothing on the path is in the source.
    pub(crate) fn line_of(&self, path: &[Seg]) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (p, line) in &self.entries {
            if p.len() <= path.len()
                && path.starts_with(p)
                && best.is_none_or(|(len, _)| p.len() > len)
            {
                best = Some((p.len(), *line));
            }
        }
        best.map(|(_, line)| line)
    }
}

struct Scanner {
    chars: Vec<char>,
    pos: usize,
    line: usize,
    out: Vec<(Vec<Seg>, usize)>,
}

impl Scanner {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, off: usize) -> Option<char> {
        self.chars.get(self.pos + off).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn starts_with(&self, s: &str) -> bool {
        s.chars()
            .enumerate()
            .all(|(i, c)| self.peek_at(i) == Some(c))
    }

    /// Skips spaces and tabs (and newlines and comments when `newlines`).
    fn skip_ws(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\r' => {
                    self.bump();
                }
                '\n' if newlines => {
                    self.bump();
                }
                '#' if newlines => self.skip_line(),
                _ => break,
            }
        }
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.peek() {
            if c == '\n' {
                break;
            }
            self.bump();
        }
    }

    fn document(&mut self) {
        let mut table: Vec<Seg> = Vec::new();
        // Arrays of tables seen so far, keyed by resolved path, with their length.
        let mut arrays: Vec<(Vec<Seg>, usize)> = Vec::new();
        loop {
            self.skip_ws(true);
            let Some(c) = self.peek() else { break };
            let ok = if c == '[' {
                self.header(&mut table, &mut arrays)
            } else {
                self.keyval(&table)
            };
            if ok.is_none() {
                self.skip_line();
            }
        }
    }

    fn header(&mut self, table: &mut Vec<Seg>, arrays: &mut Vec<(Vec<Seg>, usize)>) -> Option<()> {
        let line = self.line;
        let is_array = self.starts_with("[[");
        self.pos += if is_array { 2 } else { 1 };
        let keys = self.key()?;
        self.skip_ws(false);
        let close = if is_array { "]]" } else { "]" };
        if !self.starts_with(close) {
            return None;
        }
        self.pos += close.len();
        // Resolve every prefix that names an array of tables to its last element.
        let mut path = Vec::new();
        let last = keys.len().saturating_sub(1);
        for (i, k) in keys.into_iter().enumerate() {
            path.push(Seg::Key(k));
            let count = arrays.iter().find(|(p, _)| *p == path).map(|(_, n)| *n);
            if i == last && is_array {
                let n = count.unwrap_or(0);
                match arrays.iter_mut().find(|(p, _)| *p == path) {
                    Some(entry) => entry.1 += 1,
                    None => arrays.push((path.clone(), 1)),
                }
                path.push(Seg::Index(n));
            } else if let Some(n) = count {
                path.push(Seg::Index(n.saturating_sub(1)));
            }
        }
        self.out.push((path.clone(), line));
        *table = path;
        Some(())
    }

    /// `key.sub = value`, recording the key and everything inside the value.
    fn keyval(&mut self, base: &[Seg]) -> Option<()> {
        let line = self.line;
        let keys = self.key()?;
        self.skip_ws(false);
        if self.bump()? != '=' {
            return None;
        }
        let mut path = base.to_vec();
        path.extend(keys.into_iter().map(Seg::Key));
        self.out.push((path.clone(), line));
        self.skip_ws(false);
        self.value(&path)
    }

    /// A dotted key: bare or quoted parts separated by dots.
    fn key(&mut self) -> Option<Vec<String>> {
        let mut parts = Vec::new();
        loop {
            self.skip_ws(false);
            let part = match self.peek()? {
                '"' => self.basic_string(),
                '\'' => self.literal_string(),
                _ => {
                    let mut s = String::new();
                    while let Some(c) = self.peek() {
                        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                            s.push(c);
                            self.bump();
                        } else {
                            break;
                        }
                    }
                    (!s.is_empty()).then_some(s)
                }
            }?;
            parts.push(part);
            self.skip_ws(false);
            if self.peek() == Some('.') {
                self.bump();
            } else {
                return Some(parts);
            }
        }
    }

    fn value(&mut self, path: &[Seg]) -> Option<()> {
        match self.peek()? {
            '"' | '\'' => self.string().map(|_| ()),
            '[' => {
                self.bump();
                let mut index = 0;
                loop {
                    self.skip_ws(true);
                    match self.peek()? {
                        ']' => {
                            self.bump();
                            return Some(());
                        }
                        ',' => {
                            self.bump();
                            index += 1;
                        }
                        _ => {
                            let mut elem = path.to_vec();
                            elem.push(Seg::Index(index));
                            self.out.push((elem.clone(), self.line));
                            self.value(&elem)?;
                        }
                    }
                }
            }
            '{' => {
                self.bump();
                loop {
                    self.skip_ws(true);
                    match self.peek()? {
                        '}' => {
                            self.bump();
                            return Some(());
                        }
                        ',' => {
                            self.bump();
                        }
                        _ => self.keyval(path)?,
                    }
                }
            }
            _ => {
                // Numbers, booleans, dates: up to a delimiter.
                while let Some(c) = self.peek() {
                    if matches!(c, ',' | ']' | '}' | '\n' | '#') {
                        break;
                    }
                    self.bump();
                }
                Some(())
            }
        }
    }

    fn string(&mut self) -> Option<String> {
        if self.starts_with("\"\"\"") {
            self.multiline("\"\"\"", true)
        } else if self.starts_with("'''") {
            self.multiline("'''", false)
        } else if self.peek() == Some('"') {
            self.basic_string()
        } else {
            self.literal_string()
        }
    }

    fn basic_string(&mut self) -> Option<String> {
        self.bump();
        let mut s = String::new();
        loop {
            match self.bump()? {
                '"' => return Some(s),
                '\n' => return None,
                '\\' => {
                    // Keys rarely contain escapes; keep the escaped char as is.
                    s.push(self.bump()?);
                }
                c => s.push(c),
            }
        }
    }

    fn literal_string(&mut self) -> Option<String> {
        self.bump();
        let mut s = String::new();
        loop {
            match self.bump()? {
                '\'' => return Some(s),
                '\n' => return None,
                c => s.push(c),
            }
        }
    }

    fn multiline(&mut self, delim: &str, escapes: bool) -> Option<String> {
        self.pos += 3;
        let mut s = String::new();
        loop {
            if self.starts_with(delim) {
                self.pos += 3;
                // Up to two quotes may directly precede the closing delimiter.
                while self.starts_with(&delim[..1]) {
                    self.pos += 1;
                }
                return Some(s);
            }
            let c = self.bump()?;
            if escapes && c == '\\' {
                self.bump()?;
                continue;
            }
            s.push(c);
        }
    }
}
