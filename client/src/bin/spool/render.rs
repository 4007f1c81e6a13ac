//! How `spool` prints results: every command builds an [`Output`] holding
//! both an aligned text table (default) and a JSON value (`--json`, for
//! scripts), so the two never disagree on content. `send` and `recv` stream
//! instead, one row (or one JSON object per line) as each message is
//! acknowledged: [`StreamTable`] prints their rows.
//!
//! Text output is terminal-safe: every cell and message goes through
//! [`escape`], so a payload, key, reason or queue name holding control
//! characters (ESC, BEL, CR, backspace, ...) prints them as visible escapes
//! and cannot move the cursor, clear the screen or set the terminal title.
//! JSON output is exact JSON (serde escapes control characters as `\u00XX`).

use std::io::Write;

use serde_json::{json, Value};
use spool_client::spool_wire::proto::{Offset, PartitionId};

use crate::Failure;

/// A text table: a header row and data rows of equal width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub headers: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: Vec<&'static str>) -> Self {
        Self { headers, rows: Vec::new() }
    }

    /// Adds a row of raw cells (escaped when rendered).
    pub fn push(&mut self, row: Vec<String>) {
        assert_eq!(row.len(), self.headers.len());
        self.rows.push(row);
    }

    /// Columns padded to their widest (escaped) cell, separated by two
    /// spaces; no trailing spaces.
    pub fn render(&self) -> String {
        let rows: Vec<Vec<String>> =
            self.rows.iter().map(|row| row.iter().map(|cell| escape(cell)).collect()).collect();
        let stream = StreamTable::fitting(self.headers.clone(), &rows);
        let mut out = stream.header();
        for row in &rows {
            out.push_str(&stream.line(row));
        }
        out
    }
}

/// Column widths fixed before the rows are known, so rows can be printed
/// one at a time (as `send` and `recv` get acknowledgements) and still line
/// up: a column is as wide as its header, or as the widest cell of the rows
/// given up front. A later, wider cell pushes the rest of its row right.
#[derive(Debug, Clone)]
pub struct StreamTable {
    headers: Vec<&'static str>,
    widths: Vec<usize>,
}

impl StreamTable {
    /// Widths of the headers and of the (already escaped) `rows`.
    pub fn fitting(headers: Vec<&'static str>, rows: &[Vec<String>]) -> Self {
        let mut widths: Vec<usize> = headers.iter().map(|header| header.len()).collect();
        for row in rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        Self { headers, widths }
    }

    /// The header line.
    pub fn header(&self) -> String {
        let headers: Vec<String> = self.headers.iter().map(|&header| header.to_owned()).collect();
        self.line(&headers)
    }

    /// One row of raw cells, escaped.
    pub fn row(&self, cells: &[String]) -> String {
        let escaped: Vec<String> = cells.iter().map(|cell| escape(cell)).collect();
        self.line(&escaped)
    }

    /// One line of already escaped cells.
    fn line(&self, cells: &[String]) -> String {
        assert_eq!(cells.len(), self.widths.len());
        let mut text = String::new();
        for (index, (cell, width)) in cells.iter().zip(&self.widths).enumerate() {
            if index > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            if index + 1 < cells.len() {
                text.push_str(&" ".repeat(width.saturating_sub(cell.chars().count())));
            }
        }
        text.push('\n');
        text
    }
}

/// `text` safe to print on a terminal: C0 control characters and DEL become
/// `\xNN` (`\n`, `\r`, `\t` by name), C1 control characters and Unicode
/// bidirectional and other invisible format characters become `\u{NNNN}`,
/// and a
/// backslash becomes `\\`, so an escape in the output always means the
/// byte was there. Everything else prints as it is.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            character if u32::from(character) < 0x80 && character.is_control() => {
                out.push_str(&format!("\\x{:02x}", u32::from(character)));
            }
            character if character.is_control() || is_invisible_format(character) => {
                out.push_str(&format!("\\u{{{:x}}}", u32::from(character)));
            }
            character => out.push(character),
        }
    }
    out
}

/// Format characters that change how the rest of a line displays without
/// showing themselves: bidirectional overrides and isolates, zero-width
/// characters, the byte-order mark.
fn is_invisible_format(character: char) -> bool {
    matches!(
        u32::from(character),
        0x200b..=0x200f | 0x2028..=0x202e | 0x2060..=0x2069 | 0xfeff | 0xfff9..=0xfffb
    )
}

/// A command's result in both forms.
#[derive(Debug, Clone)]
pub struct Output {
    pub table: Option<Table>,
    /// Further tables, each printed after a blank line (text mode only).
    pub more: Vec<Table>,
    /// Printed after the tables in text mode (e.g. "created queue jobs").
    pub message: Option<String>,
    pub json: Value,
}

impl Output {
    pub fn message(message: String, json: Value) -> Self {
        Self { table: None, more: Vec::new(), message: Some(message), json }
    }

    pub fn table(table: Table, json: Value) -> Self {
        Self { table: Some(table), more: Vec::new(), message: None, json }
    }

    /// A command that printed its rows as they came (`send`, `recv`):
    /// nothing left to print.
    pub fn streamed() -> Self {
        Self { table: None, more: Vec::new(), message: None, json: Value::Null }
    }

    pub fn render(&self, json: bool) -> String {
        if self.table.is_none() && self.message.is_none() && self.json.is_null() {
            return String::new();
        }
        if json {
            let mut text = self.json.to_string();
            text.push('\n');
            return text;
        }
        let mut text = self.table.as_ref().map(Table::render).unwrap_or_default();
        for table in &self.more {
            text.push('\n');
            text.push_str(&table.render());
        }
        if let Some(message) = &self.message {
            text.push_str(&escape(message));
            text.push('\n');
        }
        text
    }
}

/// Bytes as text when they are UTF-8, else as hex with a `0x` prefix.
pub fn show_bytes(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
            format!("0x{hex}")
        }
    }
}

/// Prints streamed rows: table lines or JSON Lines, flushed on demand.
pub struct Printer {
    json: bool,
    stdout: std::io::BufWriter<std::io::Stdout>,
    /// A write failed (stdout closed): later writes are skipped, `flush`
    /// reports it.
    broken: Option<std::io::Error>,
}

impl Printer {
    pub fn new(json: bool) -> Self {
        Self { json, stdout: std::io::BufWriter::new(std::io::stdout()), broken: None }
    }

    fn write(&mut self, text: &str) {
        if self.broken.is_none() {
            if let Err(error) = self.stdout.write_all(text.as_bytes()) {
                self.broken = Some(error);
            }
        }
    }

    /// The table's header (nothing in JSON mode).
    pub fn header(&mut self, table: &StreamTable) {
        if !self.json {
            self.write(&table.header());
        }
    }

    /// One table row, or one JSON object on its own line.
    pub fn row(&mut self, table: &StreamTable, cells: &[String], json: &Value) {
        if self.json {
            let mut line = json.to_string();
            line.push('\n');
            self.write(&line);
        } else {
            self.write(&table.row(cells));
        }
    }

    pub fn sent(
        &mut self,
        table: &StreamTable,
        queue: &str,
        partition: PartitionId,
        offset: Offset,
        line: Option<u64>,
    ) {
        let mut json = json!({"queue": queue, "partition": partition.0, "offset": offset.0});
        if let (Some(line), Value::Object(map)) = (line, &mut json) {
            map.insert("line".to_owned(), Value::from(line));
        }
        self.row(table, &[partition.0.to_string(), offset.0.to_string()], &json);
    }

    pub fn flush(&mut self) -> Result<(), Failure> {
        if self.broken.is_none() {
            if let Err(error) = self.stdout.flush() {
                self.broken = Some(error);
            }
        }
        match &self.broken {
            None => Ok(()),
            Some(error) => Err(Failure::Input(format!("stdout: {error}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: streamed rows line up with their header and a streamed command
    // prints nothing more at the end. Method: a two-column stream table, a
    // row wider than the header, and Output::streamed in both modes.
    #[test]
    fn stream_table_rows_align() {
        let table = StreamTable::fitting(vec!["partition", "offset"], &[]);
        assert_eq!(table.header(), "partition  offset\n");
        assert_eq!(table.row(&["1".into(), "0".into()]), "1          0\n");
        assert_eq!(table.row(&["12345678901".into(), "7".into()]), "12345678901  7\n");
        assert_eq!(Output::streamed().render(false), "");
        assert_eq!(Output::streamed().render(true), "");
    }
}
