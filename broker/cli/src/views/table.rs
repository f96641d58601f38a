//! The tables of the listings (`relay agent list`, `flight list`, `approval list`,
//! `conversation list`, `rule list`, `usage`): a header row (numbers aligned right), columns as wide as their widest cell, fitted to
//! the terminal by cutting the one column that gives (a summary, a task) at a word with
//! an ellipsis, states in colour on a terminal, and a line on stderr when there is
//! nothing to list. In a pipe nothing is cut: scripts get every cell whole (or use
//! `--json`).

use crate::terminal::{columns, cut, one_line, styledln, Paint};

/// One cell: its text (made inert and one-line here) and its style.
pub struct Cell {
    text: String,
    paint: Paint,
}

impl Cell {
    pub fn new(text: impl AsRef<str>) -> Cell {
        Cell {
            text: one_line(text.as_ref()),
            paint: Paint::Plain,
        }
    }

    /// A state, coloured by its name ([`Paint::for_state`]).
    pub fn state(text: impl AsRef<str>) -> Cell {
        let text = text.as_ref();
        Cell {
            paint: Paint::for_state(text),
            text: one_line(text),
        }
    }

    pub fn dim(text: impl AsRef<str>) -> Cell {
        Cell {
            paint: Paint::Dim,
            ..Cell::new(text)
        }
    }

    /// A total's label.
    pub fn bold(text: impl AsRef<str>) -> Cell {
        Cell {
            paint: Paint::Bold,
            ..Cell::new(text)
        }
    }
}

pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<Cell>>,
    /// The column cut to fit the terminal (the last one by default); none: nothing is
    /// cut, long rows wrap.
    flex: Option<usize>,
    /// Columns left out, in this order, when the table does not fit even with the
    /// flexible column cut to [`MIN_FLEX`].
    optional: Vec<usize>,
    /// Leave the optional columns out before cutting the flexible one (a key that must
    /// stay whole matters more than a breakdown).
    drop_first: bool,
    /// Columns aligned to the right (numbers).
    right: Vec<usize>,
}

/// The narrowest the flexible column is cut to before columns are left out (and, with
/// none left to leave out, the table is let wrap).
const MIN_FLEX: usize = 10;

impl Table {
    pub fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
            flex: Some(headers.len().saturating_sub(1)),
            optional: Vec::new(),
            drop_first: false,
            right: Vec::new(),
        }
    }

    fn positions(&self, headers: &[&str]) -> Vec<usize> {
        headers
            .iter()
            .filter_map(|h| self.headers.iter().position(|x| x == h))
            .collect()
    }

    /// The column (by header) cut to fit the terminal, instead of the last one.
    pub fn flex(mut self, header: &str) -> Table {
        self.flex = self.headers.iter().position(|x| *x == header);
        self
    }

    /// The columns (by header) aligned to the right: numbers.
    pub fn right(mut self, headers: &[&str]) -> Table {
        self.right = self.positions(headers);
        self
    }

    /// On a narrow terminal, leave the optional columns out before cutting the flexible
    /// one.
    pub fn drop_before_cutting(mut self) -> Table {
        self.drop_first = true;
        self
    }

    /// The columns (by header) a narrow terminal may do without, the first to go first.
    pub fn optional(mut self, headers: &[&str]) -> Table {
        self.optional = self.positions(headers);
        self
    }

    /// A table whose last column is never cut: what a person must read whole (the
    /// command an approval asks to run: its end may be what matters).
    pub fn uncut(mut self) -> Table {
        self.flex = None;
        self
    }

    pub fn row(&mut self, cells: Vec<Cell>) {
        self.rows.push(cells);
    }

    /// Prints the table on stdout fitted to `width` (none: a pipe, nothing cut), or
    /// `empty` on stderr when it has no row.
    pub fn print(self, width: Option<usize>, empty: &str) {
        for line in self.render(width) {
            styledln!("{line}");
        }
        if self.rows.is_empty() {
            crate::terminal::errln!("{empty}");
        }
    }

    /// The lines of the table (none without rows).
    pub fn render(&self, width: Option<usize>) -> Vec<String> {
        if self.rows.is_empty() {
            return Vec::new();
        }
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| columns(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(n) {
                widths[i] = widths[i].max(columns(&cell.text));
            }
        }
        let mut shown: Vec<usize> = (0..n).collect();
        if let (Some(width), Some(flex)) = (width, self.flex) {
            let mut dropping = self.optional.iter();
            loop {
                let total: usize =
                    shown.iter().map(|&i| widths[i]).sum::<usize>() + 2 * (shown.len() - 1);
                if total <= width {
                    break;
                }
                let others = total - widths[flex];
                let can_drop = dropping.clone().any(|i| shown.contains(i));
                if self.drop_first && can_drop {
                    if let Some(i) = dropping.next() {
                        shown.retain(|s| s != i);
                    }
                    continue;
                }
                if width.saturating_sub(others) >= MIN_FLEX.min(widths[flex]) {
                    widths[flex] = width - others;
                    break;
                }
                match dropping.next() {
                    Some(i) => shown.retain(|s| s != i),
                    None => {
                        widths[flex] = MIN_FLEX.min(widths[flex]);
                        break;
                    }
                }
            }
        }
        let mut lines = Vec::with_capacity(self.rows.len() + 1);
        let header: Vec<Cell> = self
            .headers
            .iter()
            .map(|h| Cell {
                text: h.to_string(),
                paint: Paint::Bold,
            })
            .collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (k, &i) in shown.iter().enumerate() {
                let Some(cell) = row.get(i) else { break };
                let last = shown[k + 1..]
                    .iter()
                    .all(|&j| row.get(j).is_none_or(|c| c.text.is_empty()));
                let text = match self.flex {
                    Some(_) => cut(&cell.text, widths[i]),
                    None => cell.text.clone(),
                };
                let pad = widths[i].saturating_sub(columns(&text));
                if self.right.contains(&i) {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(&cell.paint.paint(&text));
                    if last {
                        break;
                    }
                    line.push_str("  ");
                    continue;
                }
                line.push_str(&cell.paint.paint(&text));
                if last {
                    break;
                }
                line.push_str(&" ".repeat(pad + 2));
            }
            lines.push(line.trim_end().to_string());
        }
        lines
    }
}

/// How long ago `ms` (a Unix time in milliseconds) was, for a person: `12s ago`, `3m
/// ago`, `5h ago`, `2d ago`.
pub fn age(ms: u64) -> String {
    let secs = relay_protocol::clock::now_ms().saturating_sub(ms) / 1000;
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let mut t = Table::new(&["NAME", "STATE", "SUMMARY"]);
        t.row(vec![
            Cell::new("codex-1"),
            Cell::state("running"),
            Cell::new("writing the parser tests for the new grammar"),
        ]);
        t.row(vec![
            Cell::new("a-much-longer-agent-name"),
            Cell::state("idle"),
            Cell::new(""),
        ]);
        t
    }

    #[test]
    fn a_table_has_a_header_and_aligned_columns() {
        let lines = table().render(None);
        assert_eq!(
            lines,
            vec![
                "NAME                      STATE    SUMMARY",
                "codex-1                   running  writing the parser tests for the new grammar",
                "a-much-longer-agent-name  idle",
            ]
        );
    }

    #[test]
    fn a_narrow_terminal_cuts_the_summary_at_a_word() {
        let lines = table().render(Some(60));
        assert!(lines.iter().all(|l| columns(l) <= 60), "{lines:#?}");
        assert_eq!(
            lines[1],
            "codex-1                   running  writing the parser tests…"
        );
    }

    #[test]
    fn a_very_narrow_terminal_leaves_optional_columns_out() {
        let lines = table().optional(&["STATE"]).render(Some(38));
        assert_eq!(lines[0], "NAME                      SUMMARY");
        assert_eq!(lines[1], "codex-1                   writing the…");
        assert!(lines.iter().all(|l| columns(l) <= 38), "{lines:#?}");
    }

    #[test]
    fn an_uncut_table_keeps_its_last_column_whole() {
        let lines = table().uncut().render(Some(40));
        assert!(lines[1].ends_with("for the new grammar"), "{lines:#?}");
    }

    #[test]
    fn agent_text_in_a_cell_is_inert_and_on_one_line() {
        let mut t = Table::new(&["A"]);
        t.row(vec![Cell::new("x\x1b[31m\ny")]);
        assert_eq!(t.render(None)[1], "x\\x1b[31m\\ny");
    }

    #[test]
    fn ages_read_like_a_person_says_them() {
        let now = relay_protocol::clock::now_ms();
        assert_eq!(age(now), "0s ago");
        assert_eq!(age(now - 3 * 60_000), "3m ago");
        assert_eq!(age(now - 5 * 3_600_000), "5h ago");
        assert_eq!(age(now - 2 * 86_400_000), "2d ago");
    }
}
