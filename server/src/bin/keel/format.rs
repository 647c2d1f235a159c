//! `--format` for `keel consume` and `keel read`: a line per record built
//! from `%` fields, as `kcat -f` and `rpk -f` do, with keys and values
//! written as their bytes, or as hex or base64.

use std::io::Write;

use keel_client::pb;

/// How key and value bytes are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Encoding {
    /// The bytes as they are (text stays text; binary stays binary).
    #[default]
    Raw,
    /// Lower-case hexadecimal.
    Hex,
    /// Standard base64, padded.
    Base64,
}

/// One piece of a format.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Literal(Vec<u8>),
    Topic,
    Partition,
    Offset,
    Key,
    Value,
    AppendTime,
    Headers,
}

/// A parsed `--format`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordFormat(Vec<Piece>);

/// What `--format` accepts, for its help and its errors.
pub const FIELDS: &str = "%t topic, %p partition, %o offset, %k key, %v value, %T append time (ms since \
    the epoch), %h headers (k=v,...), %% a percent sign; \\n newline, \\t tab, \\\\ backslash";

impl std::str::FromStr for RecordFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut pieces = Vec::new();
        let mut literal = Vec::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            let field = match c {
                '%' => match chars.next() {
                    Some('t') => Piece::Topic,
                    Some('p') => Piece::Partition,
                    Some('o') => Piece::Offset,
                    Some('k') => Piece::Key,
                    Some('v') => Piece::Value,
                    Some('T') => Piece::AppendTime,
                    Some('h') => Piece::Headers,
                    Some('%') => {
                        literal.push(b'%');
                        continue;
                    }
                    other => {
                        let got = other.map_or("the end".to_string(), |c| format!("%{c}"));
                        return Err(format!("unknown field {got} in {text:?}; use {FIELDS}"));
                    }
                },
                '\\' => {
                    match chars.next() {
                        Some('n') => literal.push(b'\n'),
                        Some('t') => literal.push(b'\t'),
                        Some('\\') => literal.push(b'\\'),
                        other => {
                            let got = other.map_or("the end".to_string(), |c| format!("\\{c}"));
                            return Err(format!("unknown escape {got} in {text:?}; use {FIELDS}"));
                        }
                    }
                    continue;
                }
                c => {
                    let mut buffer = [0; 4];
                    literal.extend_from_slice(c.encode_utf8(&mut buffer).as_bytes());
                    continue;
                }
            };
            if !literal.is_empty() {
                pieces.push(Piece::Literal(std::mem::take(&mut literal)));
            }
            pieces.push(field);
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        Ok(RecordFormat(pieces))
    }
}

fn encode(bytes: &[u8], encoding: Encoding) -> Vec<u8> {
    use base64::Engine;
    match encoding {
        Encoding::Raw => bytes.to_vec(),
        Encoding::Hex => bytes.iter().flat_map(|b| format!("{b:02x}").into_bytes()).collect(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes).into_bytes(),
    }
}

impl RecordFormat {
    /// The bytes of one record, `topic`/`partition` where it was read.
    pub fn render(&self, topic: &str, partition: u32, stored: &pb::StoredRecord, encoding: Encoding) -> Vec<u8> {
        let empty = pb::Record::default();
        let record = stored.record.as_ref().unwrap_or(&empty);
        let mut out = Vec::new();
        for piece in &self.0 {
            match piece {
                Piece::Literal(bytes) => out.extend_from_slice(bytes),
                Piece::Topic => out.extend_from_slice(topic.as_bytes()),
                Piece::Partition => out.extend_from_slice(partition.to_string().as_bytes()),
                Piece::Offset => out.extend_from_slice(stored.offset.to_string().as_bytes()),
                Piece::Key => out.extend(encode(record.key.as_deref().unwrap_or_default(), encoding)),
                Piece::Value => out.extend(encode(&record.value, encoding)),
                Piece::AppendTime => out.extend_from_slice(stored.append_time_ms.to_string().as_bytes()),
                Piece::Headers => {
                    for (i, header) in record.headers.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(header.key.as_bytes());
                        out.push(b'=');
                        out.extend(encode(&header.value, encoding));
                    }
                }
            }
        }
        out
    }

    /// Write one record to standard output. An error means the output is
    /// gone (a closed pipe: `| head`) or full: the caller stops.
    pub fn print(
        &self,
        topic: &str,
        partition: u32,
        stored: &pb::StoredRecord,
        encoding: Encoding,
    ) -> std::io::Result<()> {
        std::io::stdout().lock().write_all(&self.render(topic, partition, stored, encoding))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(key: Option<&[u8]>, value: &[u8]) -> pb::StoredRecord {
        pb::StoredRecord {
            offset: 42,
            append_time_ms: 1_700_000_000_000,
            record: Some(pb::Record {
                key: key.map(<[u8]>::to_vec),
                value: value.to_vec(),
                headers: vec![pb::Header { key: "h".into(), value: b"x".to_vec() }],
                ..Default::default()
            }),
        }
    }

    #[test]
    fn fields_escapes_and_encodings() {
        let format: RecordFormat = "%t/%p@%o %k=%v %T [%h] 100%%\\t|\\n".parse().unwrap();
        let line = format.render("orders", 2, &stored(Some(b"user"), b"hi"), Encoding::Raw);
        assert_eq!(line, b"orders/2@42 user=hi 1700000000000 [h=x] 100%\t|\n");
        let line = "%k %v\\n".parse::<RecordFormat>().unwrap().render("t", 0, &stored(None, &[0xff, 0]), Encoding::Hex);
        assert_eq!(line, b" ff00\n");
        let line = "%v".parse::<RecordFormat>().unwrap().render("t", 0, &stored(None, &[0xff, 0]), Encoding::Base64);
        assert_eq!(line, b"/wA=");
        // Raw bytes go out as they are: nothing is lost.
        let line = "%v".parse::<RecordFormat>().unwrap().render("t", 0, &stored(None, &[0xff, 0]), Encoding::Raw);
        assert_eq!(line, [0xff, 0]);
    }

    #[test]
    fn unknown_fields_and_escapes_are_refused_with_the_list() {
        for bad in ["%x", "50%", "\\q", "tail\\"] {
            let error = bad.parse::<RecordFormat>().unwrap_err();
            assert!(error.contains("%t topic"), "{bad}: {error}");
        }
    }
}
