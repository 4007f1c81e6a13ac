//! How `spool` prints results: every command builds an [`Output`] holding
//! both an aligned text table (default) and a JSON value (`--json`, for
//! scripts), so the two never disagree on content.

use serde_json::Value;

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

    pub fn push(&mut self, row: Vec<String>) {
        assert_eq!(row.len(), self.headers.len());
        self.rows.push(row);
    }

    /// Columns padded to their widest cell, separated by two spaces; no
    /// trailing spaces.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|header| header.len()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let mut text = String::new();
            for (index, (cell, width)) in cells.iter().zip(&widths).enumerate() {
                if index > 0 {
                    text.push_str("  ");
                }
                text.push_str(cell);
                if index + 1 < cells.len() {
                    text.push_str(&" ".repeat(width - cell.chars().count()));
                }
            }
            text.push('\n');
            text
        };
        let mut out = line(self.headers.clone());
        for row in &self.rows {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        out
    }
}

/// A command's result in both forms.
#[derive(Debug, Clone)]
pub struct Output {
    pub table: Option<Table>,
    /// Printed after the table in text mode (e.g. "created queue jobs").
    pub message: Option<String>,
    pub json: Value,
}

impl Output {
    pub fn message(message: String, json: Value) -> Self {
        Self { table: None, message: Some(message), json }
    }

    pub fn table(table: Table, json: Value) -> Self {
        Self { table: Some(table), message: None, json }
    }

    pub fn render(&self, json: bool) -> String {
        if json {
            let mut text = self.json.to_string();
            text.push('\n');
            return text;
        }
        let mut text = self.table.as_ref().map(Table::render).unwrap_or_default();
        if let Some(message) = &self.message {
            text.push_str(message);
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
