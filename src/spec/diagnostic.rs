//! Diagnostics for user-written files: where (file, line, column, field path), what was found,
//! what was expected, and a hint. Collects every problem of a file; never stops at the first.
//! Must not print anything itself: rendering returns a `String`.

use std::fmt;

/// One problem in a user file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    /// Field path such as `tpus[2].chip_limit`; empty for the document itself.
    pub path: String,
    /// 1-based line of the offending node.
    pub line: usize,
    /// 1-based column of the offending node.
    pub column: usize,
    /// What is wrong: usually "expected …, found …".
    pub message: String,
    /// How to fix it, when there is something useful to say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// Every problem found in one file, with the source kept for rendering snippets.
#[derive(Clone, Debug)]
pub struct SpecErrors {
    /// The file name as the user gave it.
    pub file: String,
    /// The file's text (for snippets).
    pub source: String,
    /// The problems, in file order.
    pub diagnostics: Vec<Diagnostic>,
}

impl SpecErrors {
    /// Builds the error set, sorting diagnostics by position so output is stable.
    pub fn new(file: &str, source: &str, mut diagnostics: Vec<Diagnostic>) -> Self {
        diagnostics.sort_by(|a, b| (a.line, a.column, &a.path).cmp(&(b.line, b.column, &b.path)));
        diagnostics.dedup();
        SpecErrors {
            file: file.to_owned(),
            source: source.to_owned(),
            diagnostics,
        }
    }

    /// Renders all diagnostics in a compiler-like plain-text format (no colour).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let lines: Vec<&str> = self.source.lines().collect();
        for d in self.diagnostics.iter().take(SHOWN) {
            let location = if d.path.is_empty() {
                String::new()
            } else {
                format!("{}: ", d.path)
            };
            out.push_str(&format!("error: {location}{}\n", d.message));
            out.push_str(&format!("  --> {}:{}:{}\n", self.file, d.line, d.column));
            if let Some(line) = d.line.checked_sub(1).and_then(|i| lines.get(i)) {
                let gutter = d.line.to_string();
                let pad = " ".repeat(gutter.len());
                let column = d.column.saturating_sub(1).min(line.chars().count());
                let (text, caret_col) = snippet(line, column);
                out.push_str(&format!("{pad} |\n{gutter} | {text}\n"));
                let width = token_width(&text, caret_col).min(SNIPPET - 1);
                out.push_str(&format!(
                    "{pad} | {}{}\n",
                    " ".repeat(caret_col),
                    "^".repeat(width)
                ));
            }
            if let Some(hint) = &d.hint {
                out.push_str(&format!("  = hint: {hint}\n"));
            }
            out.push('\n');
        }
        let n = self.diagnostics.len();
        if n > SHOWN {
            out.push_str(&format!(
                "… and {} more (the first {SHOWN} are shown)\n",
                n - SHOWN
            ));
        }
        out.push_str(&format!(
            "{}: {n} error{} found\n",
            self.file,
            if n == 1 { "" } else { "s" }
        ));
        out
    }
}

/// Diagnostics shown in full; the rest are counted.
const SHOWN: usize = 50;

/// Characters of a source line shown around a problem.
const SNIPPET: usize = 160;

/// The part of `line` shown for a problem at character `column` (a long line — a one-line
/// JSON file — is cut to a window, marked with `…`), and the column within it.
fn snippet(line: &str, column: usize) -> (String, usize) {
    let chars: Vec<char> = line.chars().collect();
    if chars.len() <= SNIPPET {
        return (line.to_owned(), column);
    }
    let start = column.saturating_sub(SNIPPET / 3);
    let end = (start + SNIPPET).min(chars.len());
    let mut text: String = chars[start..end].iter().collect();
    let mut caret = column - start;
    if start > 0 {
        text.insert(0, '…');
        caret += 1;
    }
    if end < chars.len() {
        text.push('…');
    }
    (text, caret)
}

/// Width of the token starting at `col` (up to whitespace or a YAML separator), at least 1.
fn token_width(text: &str, col: usize) -> usize {
    let rest: String = text.chars().skip(col).collect();
    let rest = rest.trim_end();
    let width = if let Some(quote) = rest.chars().next().filter(|c| *c == '"' || *c == '\'') {
        rest.chars()
            .skip(1)
            .position(|c| c == quote)
            .map_or(rest.chars().count(), |end| end + 2)
    } else {
        rest.chars()
            .take_while(|c| !matches!(c, ' ' | ',' | '#' | ']' | '}'))
            .count()
    };
    width.max(1)
}

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

impl std::error::Error for SpecErrors {}

/// The candidate closest to `word` when one is close enough to be a likely slip (Jaro-Winkler
/// above 0.8): what "did you mean" offers.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(c, word), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}
