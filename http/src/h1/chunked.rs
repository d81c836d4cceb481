//! The chunked transfer coding (RFC 9112 §7.1), read as it arrives without copying:
//! [`Chunked::next`] says how long the next piece of the input is and whether it is
//! framing (a size line, a chunk's CRLF, trailers) or data. A relay passes the bytes on as
//! they are (both sides speak HTTP/1.1) or only the data (re-framed for an HTTP/1.0
//! client); either way the coding is checked as strictly as the request head: every line
//! ends with CRLF, a size is hex digits that fit, and each line has a bounded length.

use crate::path::hex;

/// Longest chunk-size line (with its extensions) accepted.
pub const MAX_SIZE_LINE: usize = 4096;

/// Longest trailer section accepted, in bytes.
pub const MAX_TRAILERS: usize = 16 * 1024;

/// Most bytes of chunk extensions accepted in one body, all chunks together (hyper's
/// bound too): framing a body cannot grow without bound past its data.
pub const MAX_EXTENSIONS: usize = 16 * 1024;

/// Most hex digits of a chunk size, leading zeros included.
const MAX_SIZE_DIGITS: u32 = 16;

/// Why a chunked body cannot be followed (the request gets 400 and the connection closes;
/// a response is cut and its connection closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// A chunk size that is not hex digits, or does not fit in 64 bits.
    #[error("a chunk size is not a hexadecimal number")]
    BadSize,
    /// A chunk-size line or the trailers are longer than accepted.
    #[error("a chunk-size line or the trailers are too long")]
    TooLong,
    /// A line of the coding ends with a bare LF, or a chunk's data is not followed by CRLF.
    #[error("the chunked framing has a line that does not end with CRLF")]
    BadLineEnd,
    /// A byte that cannot appear in a chunk extension or a trailer line (a trailer is
    /// `name: value`, its name a token).
    #[error("a chunk extension or trailer holds a byte it cannot")]
    BadByte,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk size's hex digits (at least one seen when `digits > 0`).
    Size,
    /// After the size: whitespace, then `;` or CR.
    SizeWs,
    /// After `;`: extensions up to CR.
    Extension,
    /// After the size line's CR: its LF.
    SizeLf,
    /// In a chunk's data.
    Data,
    /// After the data: CR, then LF.
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// In a trailer field's name, up to its colon.
    TrailerName,
    /// In a trailer field's value, up to CR.
    Trailer,
    /// After a trailer line's CR.
    TrailerLf,
    /// After the final empty line's CR.
    EndLf,
    Done,
}

/// What the next bytes of the input are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// This many bytes of framing (size lines, CRLFs, trailers).
    Framing(usize),
    /// This many bytes of a chunk's data.
    Data(usize),
    /// This many bytes of trailer fields (a proxy drops them: a backend that merges them
    /// into the headers would see fields the proxy never checked).
    Trailer(usize),
    /// This many bytes of framing end the body; anything after them is not this body's.
    End(usize),
}

impl Piece {
    /// How many bytes it is.
    pub fn bytes(self) -> usize {
        match self {
            Piece::Framing(n) | Piece::Data(n) | Piece::Trailer(n) | Piece::End(n) => n,
        }
    }
}

/// Follows one chunked body.
#[derive(Debug, Clone)]
pub struct Chunked {
    state: State,
    /// Hex digits of the size so far, and its value.
    digits: u32,
    size: u64,
    /// Bytes of the current size line or of the trailers so far.
    line: usize,
    /// Data left in the current chunk.
    left: u64,
    /// Data bytes seen so far.
    data: u64,
    /// Extension bytes seen so far, all chunks together.
    extensions: usize,
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked {
            state: State::Size,
            digits: 0,
            size: 0,
            line: 0,
            left: 0,
            data: 0,
            extensions: 0,
        }
    }
}

impl Chunked {
    /// Whether the body ended.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Data bytes read so far (what a body limit counts).
    pub fn data_len(&self) -> u64 {
        self.data
    }

    /// The next piece of `input`, which is not empty. Err when the coding is broken.
    pub fn next(&mut self, input: &[u8]) -> Result<Piece, ChunkError> {
        if self.state == State::Done {
            return Ok(Piece::End(0));
        }
        if self.state == State::Data {
            let n = (input.len() as u64).min(self.left) as usize;
            self.left -= n as u64;
            self.data += n as u64;
            if self.left == 0 {
                self.state = State::DataCr;
            }
            return Ok(Piece::Data(n));
        }
        // Trailer bytes and framing bytes are told apart: a piece is one or the other.
        let trailer = |state: State, b: u8| {
            matches!(
                state,
                State::TrailerName | State::Trailer | State::TrailerLf
            ) || (state == State::TrailerStart && b != b'\r')
        };
        let first = trailer(self.state, input[0]);
        let mut used = 0;
        for &b in input {
            if trailer(self.state, b) != first {
                break;
            }
            used += 1;
            match self.step(b)? {
                Step::Continue => {}
                Step::DataNext => return Ok(Piece::Framing(used)),
                Step::End => return Ok(Piece::End(used)),
            }
        }
        Ok(if first {
            Piece::Trailer(used)
        } else {
            Piece::Framing(used)
        })
    }

    fn step(&mut self, b: u8) -> Result<Step, ChunkError> {
        match self.state {
            State::Size => {
                self.line_byte()?;
                match hex(b) {
                    Some(_) if self.digits == MAX_SIZE_DIGITS => return Err(ChunkError::BadSize),
                    Some(d) => {
                        self.digits += 1;
                        self.size = self
                            .size
                            .checked_mul(16)
                            .and_then(|s| s.checked_add(u64::from(d)))
                            .ok_or(ChunkError::BadSize)?;
                    }
                    None if self.digits == 0 => return Err(ChunkError::BadSize),
                    None => match b {
                        b'\r' => self.state = State::SizeLf,
                        b';' => self.state = State::Extension,
                        b' ' | b'\t' => self.state = State::SizeWs,
                        b'\n' => return Err(ChunkError::BadLineEnd),
                        _ => return Err(ChunkError::BadSize),
                    },
                }
            }
            State::SizeWs => {
                self.line_byte()?;
                match b {
                    b' ' | b'\t' => {}
                    b';' => self.state = State::Extension,
                    b'\r' => self.state = State::SizeLf,
                    b'\n' => return Err(ChunkError::BadLineEnd),
                    _ => return Err(ChunkError::BadSize),
                }
            }
            State::Extension => {
                self.line_byte()?;
                self.extensions += 1;
                if self.extensions > MAX_EXTENSIONS {
                    return Err(ChunkError::TooLong);
                }
                match b {
                    b'\r' => self.state = State::SizeLf,
                    b'\n' => return Err(ChunkError::BadLineEnd),
                    b'\t' | b' '..=b'~' | 0x80..=0xff => {}
                    _ => return Err(ChunkError::BadByte),
                }
            }
            State::SizeLf => {
                if b != b'\n' {
                    return Err(ChunkError::BadLineEnd);
                }
                self.line = 0;
                self.digits = 0;
                if self.size == 0 {
                    self.state = State::TrailerStart;
                } else {
                    self.left = self.size;
                    self.size = 0;
                    self.state = State::Data;
                    return Ok(Step::DataNext);
                }
            }
            State::DataCr => match b {
                b'\r' => self.state = State::DataLf,
                _ => return Err(ChunkError::BadLineEnd),
            },
            State::DataLf => match b {
                b'\n' => self.state = State::Size,
                _ => return Err(ChunkError::BadLineEnd),
            },
            State::TrailerStart => {
                self.trailer_byte()?;
                match b {
                    b'\r' => self.state = State::EndLf,
                    b'\n' => return Err(ChunkError::BadLineEnd),
                    b if super::is_tchar(b) => self.state = State::TrailerName,
                    _ => return Err(ChunkError::BadByte),
                }
            }
            // A trailer field is `name: value`, as a header is (RFC 9112 §7.1.2).
            State::TrailerName => {
                self.trailer_byte()?;
                match b {
                    b':' => self.state = State::Trailer,
                    b if super::is_tchar(b) => {}
                    b'\n' | b'\r' => return Err(ChunkError::BadLineEnd),
                    _ => return Err(ChunkError::BadByte),
                }
            }
            State::Trailer => {
                self.trailer_byte()?;
                match b {
                    b'\r' => self.state = State::TrailerLf,
                    b'\n' => return Err(ChunkError::BadLineEnd),
                    b'\t' | b' '..=b'~' | 0x80..=0xff => {}
                    _ => return Err(ChunkError::BadByte),
                }
            }
            State::TrailerLf => {
                self.trailer_byte()?;
                match b {
                    b'\n' => self.state = State::TrailerStart,
                    _ => return Err(ChunkError::BadLineEnd),
                }
            }
            State::EndLf => match b {
                b'\n' => {
                    self.state = State::Done;
                    return Ok(Step::End);
                }
                _ => return Err(ChunkError::BadLineEnd),
            },
            // `next` hands data over before stepping, and stops at the end.
            State::Data | State::Done => return Ok(Step::End),
        }
        Ok(Step::Continue)
    }

    fn line_byte(&mut self) -> Result<(), ChunkError> {
        self.line += 1;
        if self.line > MAX_SIZE_LINE {
            return Err(ChunkError::TooLong);
        }
        Ok(())
    }

    fn trailer_byte(&mut self) -> Result<(), ChunkError> {
        self.line += 1;
        if self.line > MAX_TRAILERS {
            return Err(ChunkError::TooLong);
        }
        Ok(())
    }
}

enum Step {
    Continue,
    /// The size line ended and data follows.
    DataNext,
    End,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in reads of `step` bytes: the data, the bytes used, and whether the
    /// body ended.
    fn read(input: &[u8], step: usize) -> Result<(Vec<u8>, usize, bool), ChunkError> {
        let mut c = Chunked::default();
        let (mut data, mut used) = (Vec::new(), 0);
        for read in input.chunks(step) {
            let mut at = 0;
            while at < read.len() {
                match c.next(&read[at..])? {
                    Piece::Framing(n) | Piece::Trailer(n) => at += n,
                    Piece::Data(n) => {
                        data.extend_from_slice(&read[at..at + n]);
                        at += n;
                    }
                    Piece::End(n) => {
                        assert!(c.is_done());
                        return Ok((data, used + at + n, true));
                    }
                }
            }
            used += read.len();
        }
        Ok((data, used, false))
    }

    #[test]
    fn chunks_extensions_and_trailers_are_followed_in_reads_of_any_size() {
        let body =
            b"5;name=value\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-t: 1\r\n\r\nNEXT";
        for step in 1..=body.len() {
            let (data, used, done) = read(body, step).unwrap();
            assert_eq!(data, b"helloabcdefghijklmnopqrstuvwxyz");
            assert!(done, "reads of {step}");
            assert_eq!(&body[used..], b"NEXT", "reads of {step}");
        }
    }

    #[test]
    fn an_unfinished_body_is_not_done() {
        let (data, _, done) = read(b"3\r\nabc\r\n0\r\n", 4).unwrap();
        assert_eq!(data, b"abc");
        assert!(!done);
    }

    #[test]
    fn broken_codings_are_refused() {
        let cases: [(&[u8], ChunkError); 9] = [
            (b"5\nhello\r\n0\r\n\r\n", ChunkError::BadLineEnd),
            (b"5\r\nhelloX\r\n0\r\n\r\n", ChunkError::BadLineEnd),
            (b"0\r\n\n", ChunkError::BadLineEnd),
            (b"0\r\nx: 1\n\r\n", ChunkError::BadLineEnd),
            (b"g\r\n", ChunkError::BadSize),
            (b"\r\n", ChunkError::BadSize),
            (b"-1\r\n", ChunkError::BadSize),
            (b"10000000000000000\r\n", ChunkError::BadSize),
            (b"1;a\x00b\r\n", ChunkError::BadByte),
        ];
        for (input, why) in cases {
            assert_eq!(
                read(input, input.len()).unwrap_err(),
                why,
                "{}",
                String::from_utf8_lossy(input)
            );
        }
        let long = [b"1;".as_slice(), &[b'a'; MAX_SIZE_LINE]].concat();
        assert_eq!(read(&long, 100).unwrap_err(), ChunkError::TooLong);
        let trailers = [b"0\r\nx: ".as_slice(), &[b'a'; MAX_TRAILERS]].concat();
        assert_eq!(read(&trailers, 100).unwrap_err(), ChunkError::TooLong);
        for bad in [
            &b"0\r\nHTTP/X-T: 1\r\n\r\n"[..],
            b"0\r\n\xd9-T: 1\r\n\r\n",
            b"0\r\nNoColon\r\n\r\n",
        ] {
            assert!(read(bad, 4).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let folded = b"0\r\nx: 1\r\n continued\r\n\r\n";
        assert_eq!(read(folded, 3).unwrap_err(), ChunkError::BadByte);
        // Whitespace after a size may only lead to an extension or the line's end.
        assert_eq!(read(b"5 x\r\n", 5).unwrap_err(), ChunkError::BadSize);
        assert!(read(b"5 \t;a=1\r\nhello\r\n0\r\n\r\n", 3).unwrap().2);
        // Leading zeros count as digits: a size line cannot pad a body without bound.
        assert_eq!(
            read(b"00000000000000005\r\n", 8).unwrap_err(),
            ChunkError::BadSize
        );
    }

    /// Extensions are capped for the whole body, not per line: many chunks of one byte
    /// each with long extensions cannot multiply the body's size on the wire.
    #[test]
    fn chunk_extensions_are_capped_across_the_body() {
        let chunk = [b"1;".as_slice(), &[b'e'; 1000], b"\r\nX\r\n"].concat();
        let body: Vec<u8> = chunk
            .iter()
            .copied()
            .cycle()
            .take(chunk.len() * 17)
            .collect();
        assert_eq!(read(&body, 512).unwrap_err(), ChunkError::TooLong);
        let few: Vec<u8> = chunk
            .iter()
            .copied()
            .cycle()
            .take(chunk.len() * 15)
            .collect();
        assert!(read(&few, 512).is_ok());
    }

    /// Trailer fields are pieces of their own (a relay drops them); the final CRLF is
    /// framing, so what is kept is still a whole chunked body.
    #[test]
    fn trailers_are_told_apart_from_framing() {
        let body = b"1\r\nX\r\n0\r\nx-forwarded-for: 1.2.3.4\r\nx-b: 2\r\n\r\n";
        for step in 1..=body.len() {
            let mut c = Chunked::default();
            let (mut kept, mut dropped) = (Vec::new(), Vec::new());
            for read in body.chunks(step) {
                let mut at = 0;
                while at < read.len() {
                    let piece = c.next(&read[at..]).unwrap();
                    let (n, into) = match piece {
                        Piece::Trailer(n) => (n, &mut dropped),
                        Piece::Framing(n) | Piece::Data(n) | Piece::End(n) => (n, &mut kept),
                    };
                    into.extend_from_slice(&read[at..at + n]);
                    at += n;
                }
            }
            assert!(c.is_done());
            assert_eq!(kept, b"1\r\nX\r\n0\r\n\r\n", "reads of {step}");
            assert_eq!(
                dropped, b"x-forwarded-for: 1.2.3.4\r\nx-b: 2\r\n",
                "reads of {step}"
            );
        }
    }

    #[test]
    fn the_data_length_is_counted_as_it_arrives() {
        let mut c = Chunked::default();
        let input = b"ff\r\n";
        assert_eq!(c.next(input), Ok(Piece::Framing(4)));
        assert_eq!(c.next(&[0; 100]), Ok(Piece::Data(100)));
        assert_eq!(c.data_len(), 100);
        assert_eq!(c.next(&[0; 200]), Ok(Piece::Data(155)));
        assert_eq!(c.data_len(), 255);
    }
}
