//! Which text a schema accepts, read a byte at a time: a pushdown automaton whose stack holds
//! the open values (an object between keys, an array, a string, a number, a literal being
//! spelled). A union may leave several stacks alive at once (`["string", "null"]` before its
//! first byte; an enum's values sharing a prefix), so the state is a set of stacks, each a
//! way to read what came so far; the text is accepted while one survives.
//!
//! Whitespace goes where JSON allows it in the forms JSON is written in: nothing, one space, or
//! a newline and at most [`MAX_INDENT`] spaces or tabs (llama.cpp's JSON-Schema grammars allow
//! the same forms, with 20), so that a model cannot spend its tokens on blank lines; values
//! nest at most [`MAX_DEPTH`] deep.

use super::number::{NumberKind, NumberState};
use super::pattern::Pattern;
use super::schema::{Node, NodeId, Schema, ANY_STRING};

/// Spaces or tabs allowed after a newline between a value's parts (twelve levels of
/// four-space indentation).
pub const MAX_INDENT: u8 = 48;
/// Values open at once, at most.
pub const MAX_DEPTH: usize = 64;
/// Unions nested in unions, at most, before a first byte (a union that names itself ends).
const MAX_UNION_NESTING: u8 = 16;

/// A key that is not one of the listed properties (a free object's).
const FREE_KEY: u16 = u16::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ObjectStage {
    /// After `{`: a key or `}`.
    Open,
    /// After a key: `:`.
    Colon,
    /// After a value: `,` or `}`.
    AfterValue,
    /// After `,`: a key.
    Comma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArrayStage {
    Open,
    AfterValue,
    Comma,
}

/// One open value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// A value of `node` comes next.
    Value(NodeId),
    /// Inside an object; `next` is the first listed property that may still come, `current`
    /// the one whose key was read (or [`FREE_KEY`]).
    Object {
        node: NodeId,
        next: u16,
        current: u16,
        stage: ObjectStage,
    },
    /// Spelling listed property `property`'s key; `at` bytes of it read.
    Key {
        node: NodeId,
        property: u16,
        at: u16,
    },
    Array {
        node: NodeId,
        count: u32,
        stage: ArrayStage,
    },
    /// Inside a string after its opening quote: `chars` read; `escape` 0 (none), 1 (after a
    /// backslash) or a `\u` digit's state (see [`string_byte`]); `pending` UTF-8 continuation
    /// bytes owed.
    Str {
        node: NodeId,
        chars: u32,
        escape: u8,
        pending: u8,
        /// The state of the string's pattern, if it has one.
        matched: u32,
    },
    Number {
        node: NodeId,
        state: NumberState,
    },
    /// Spelling literal `index` of `node`; `at` bytes of it read.
    Literal {
        node: NodeId,
        index: u16,
        at: u16,
    },
}

impl Frame {
    fn takes_whitespace(&self) -> bool {
        matches!(
            self,
            Frame::Value(_) | Frame::Object { .. } | Frame::Array { .. }
        )
    }
}

/// One way to read the text so far.
#[derive(Debug, PartialEq, Eq)]
struct Stack {
    frames: Vec<Frame>,
    /// The whitespace just read: none (0), one space (1), or a newline and `n` spaces or
    /// tabs (`2 + n`).
    whitespace: u8,
}

// By hand, for `clone_from`: the mask copies states into buffers it keeps.
impl Clone for Stack {
    fn clone(&self) -> Self {
        Self {
            frames: self.frames.clone(),
            whitespace: self.whitespace,
        }
    }

    fn clone_from(&mut self, source: &Self) {
        self.frames.clone_from(&source.frames);
        self.whitespace = source.whitespace;
    }
}

/// Where a schema's reading of a text stands: the stacks still alive (none: the text left
/// the schema).
#[derive(Debug)]
pub struct Matcher {
    stacks: Vec<Stack>,
    /// Where the next byte's stacks are built (kept for its allocation).
    scratch: Vec<Stack>,
    /// Whether the schema holds the text yet (a reasoning block before it does not).
    pub(crate) reasoning: Reasoning,
}

/// Where a text stands with respect to a thinking model's reasoning, which comes before the
/// schema's value and which the schema does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reasoning {
    /// None, or it has closed: the schema holds the text.
    #[default]
    Past,
    /// At the text's start, where the model may open a block.
    MayOpen,
    /// Inside a block: any text up to the closing token.
    Open,
}

impl Clone for Matcher {
    fn clone(&self) -> Self {
        Self {
            stacks: self.stacks.clone(),
            scratch: Vec::new(),
            reasoning: self.reasoning,
        }
    }

    fn clone_from(&mut self, source: &Self) {
        self.stacks.clone_from(&source.stacks);
    }
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Self) -> bool {
        self.stacks == other.stacks
    }
}

impl Eq for Matcher {}

impl Matcher {
    /// Before the first byte of a value of `schema`.
    pub fn new(schema: &Schema) -> Self {
        Self {
            stacks: vec![Stack {
                frames: vec![Frame::Value(schema.root)],
                whitespace: 0,
            }],
            scratch: Vec::new(),
            reasoning: Reasoning::Past,
        }
    }

    /// A state no text continues (after a token off the schema).
    pub fn dead() -> Self {
        Self {
            stacks: Vec::new(),
            scratch: Vec::new(),
            reasoning: Reasoning::Past,
        }
    }

    /// Reads `bytes`; false (and no stack left) once they leave the schema.
    pub fn feed(&mut self, schema: &Schema, bytes: &[u8]) -> bool {
        for &byte in bytes {
            let mut next = std::mem::take(&mut self.scratch);
            next.clear();
            for stack in self.stacks.drain(..) {
                step(schema, stack, byte, &mut next);
            }
            dedup(&mut next);
            self.scratch = std::mem::replace(&mut self.stacks, next);
            if self.stacks.is_empty() {
                return false;
            }
        }
        true
    }

    /// Whether `bytes` would be accepted, the state unchanged.
    pub fn accepts(&self, schema: &Schema, bytes: &[u8]) -> bool {
        self.clone().feed(schema, bytes)
    }

    /// The text so far leaves the schema.
    pub fn is_dead(&self) -> bool {
        self.stacks.is_empty()
    }

    /// The text so far is a whole value of the schema (it may end here).
    pub fn can_end(&self, schema: &Schema) -> bool {
        self.stacks
            .iter()
            .any(|stack| match stack.frames.as_slice() {
                [] => true,
                [top] => complete_scalar(schema, top),
                _ => false,
            })
    }

    /// Every reading is inside a string with no length limit, at a character's start, long
    /// enough to end: plain string content leaves the state as it is (only the count of
    /// characters grows, and it no longer matters).
    pub fn in_open_string(&self, schema: &Schema) -> bool {
        !self.stacks.is_empty()
            && self.stacks.iter().all(|stack| {
                matches!(stack.frames.last(), Some(&Frame::Str { node, chars, escape: 0, pending: 0, .. })
                    if matches!(*schema.node(node), Node::String { min, max: u32::MAX, pattern: None } if chars >= min))
            })
    }

    /// The one reading is inside a string held to a pattern, at a character's start: the
    /// pattern, its state, and the characters the string has room for.
    pub(crate) fn in_pattern_string<'s>(
        &self,
        schema: &'s Schema,
    ) -> Option<(&'s Pattern, u32, u32)> {
        let [stack] = self.stacks.as_slice() else {
            return None;
        };
        match stack.frames.last() {
            Some(&Frame::Str {
                node,
                chars,
                escape: 0,
                pending: 0,
                matched,
            }) => match schema.node(node) {
                Node::String {
                    max,
                    pattern: Some(pattern),
                    ..
                } => Some((pattern, matched, max - chars)),
                _ => None,
            },
            _ => None,
        }
    }

    /// Every reading is inside a string with no pattern, at a character's start: bytes other
    /// than `"`, `\\` and control characters are accepted whatever they are, up to the
    /// characters returned (the least room any reading's string has).
    pub fn in_free_string(&self, schema: &Schema) -> Option<u32> {
        self.stacks
            .iter()
            .map(|stack| match stack.frames.last() {
                Some(&Frame::Str {
                    node,
                    chars,
                    escape: 0,
                    pending: 0,
                    ..
                }) => match *schema.node(node) {
                    Node::String {
                        max, pattern: None, ..
                    } => Some(max - chars),
                    _ => None,
                },
                _ => None,
            })
            .try_fold(u32::MAX, |room, r| r.map(|r| room.min(r)))
            .filter(|_| !self.stacks.is_empty())
    }
}

/// The characters `bytes` hold (UTF-8 continuation bytes add none).
pub(crate) fn characters(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b & 0xc0 != 0x80).count()
}

/// The length of the longest prefix of `bytes` that is plain string content (see
/// [`plain_string_bytes`]) and ends a character.
pub(crate) fn plain_prefix(bytes: &[u8]) -> usize {
    let mut state = (0, 0, 0);
    let mut boundary = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        match string_byte(state, byte, 0) {
            Some(next) if byte != b'\\' && next.1 != CLOSED => state = next,
            _ => break,
        }
        if state.2 == 0 {
            boundary = at + 1;
        }
    }
    boundary
}

/// A number or literal that may end here (the next byte that does not continue it ends it).
fn complete_scalar(schema: &Schema, frame: &Frame) -> bool {
    match *frame {
        Frame::Number { node, state } => state.complete(number_kind(schema, node)),
        Frame::Literal { node, index, at } => at as usize == literal(schema, node, index).len(),
        _ => false,
    }
}

fn literal(schema: &Schema, node: NodeId, index: u16) -> &[u8] {
    match schema.node(node) {
        Node::Literals(values) => &values[index as usize],
        other => unreachable!("a literal frame on {other:?}"),
    }
}

/// Drops stacks equal to an earlier one (two readings that agree from here on).
fn dedup(stacks: &mut Vec<Stack>) {
    let mut at = 1;
    while at < stacks.len() {
        if stacks[..at].contains(&stacks[at]) {
            stacks.remove(at);
        } else {
            at += 1;
        }
    }
}

fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// The stacks `stack` becomes on `byte`, into `out`.
fn step(schema: &Schema, mut stack: Stack, byte: u8, out: &mut Vec<Stack>) {
    let Some(&top) = stack.frames.last() else {
        return; // A whole value was read: nothing may follow.
    };
    if complete_scalar(schema, &top) && !continues(schema, &top, byte) {
        // The byte ends the number or literal and belongs to what holds it.
        stack.frames.pop();
        return step(schema, stack, byte, out);
    }
    if is_whitespace(byte) && top.takes_whitespace() {
        let next = match (stack.whitespace, byte) {
            (0, b' ') => 1,
            (0, b'\n') => 2,
            (indent @ 2.., b' ' | b'\t') if indent - 2 < MAX_INDENT => indent + 1,
            _ => return,
        };
        stack.whitespace = next;
        return out.push(stack);
    }
    stack.whitespace = 0;
    stack.frames.pop();
    match top {
        Frame::Value(node) => start_value(schema, stack, node, byte, out, 0),
        Frame::Object {
            node,
            next,
            current,
            stage,
        } => object(schema, stack, (node, next, current, stage), byte, out),
        Frame::Key { node, property, at } => {
            let Node::Object { properties, .. } = schema.node(node) else {
                unreachable!("a key frame on a non-object");
            };
            let key = &properties[property as usize].key;
            if key.get(at as usize) == Some(&byte) {
                if at as usize + 1 < key.len() {
                    stack.frames.push(Frame::Key {
                        node,
                        property,
                        at: at + 1,
                    });
                }
                out.push(stack);
            }
        }
        Frame::Array { node, count, stage } => {
            array(schema, stack, (node, count, stage), byte, out)
        }
        Frame::Str {
            node,
            chars,
            escape,
            pending,
            matched,
        } => string(
            schema,
            stack,
            (node, chars, escape, pending, matched),
            byte,
            out,
        ),
        Frame::Number { node, state } => {
            if let Some(state) = state.next(number_kind(schema, node), byte) {
                stack.frames.push(Frame::Number { node, state });
                out.push(stack);
            }
        }
        Frame::Literal { node, index, at } => {
            if literal(schema, node, index).get(at as usize) == Some(&byte) {
                stack.frames.push(Frame::Literal {
                    node,
                    index,
                    at: at + 1,
                });
                out.push(stack);
            }
        }
    }
}

/// A string frame on `byte`: its characters counted, its escapes read, its pattern stepped
/// on the characters as JSON decodes them.
fn string(
    schema: &Schema,
    mut stack: Stack,
    (node, chars, escape, pending, matched): (NodeId, u32, u8, u8, u32),
    byte: u8,
    out: &mut Vec<Stack>,
) {
    let Node::String { min, max, pattern } = schema.node(node) else {
        unreachable!("a string frame on a non-string");
    };
    let before = escape;
    let Some((chars, escape, pending)) = string_byte((chars, escape, pending), byte, *min) else {
        return;
    };
    let matched = match pattern {
        None => matched,
        Some(pattern) => {
            let decoded = match (before, escape) {
                (_, CLOSED) => {
                    return if pattern.matches(matched) {
                        out.push(stack)
                    }
                }
                // A pattern reads characters: `\u` escapes are not decoded for it (a
                // character past ASCII is written as UTF-8).
                (1, HEX_FIRST) => return,
                // A backslash only where some escape can follow it.
                (0, 1)
                    if ESCAPES
                        .iter()
                        .any(|&e| pattern.next(matched, &[unescaped(e)]).is_some()) =>
                {
                    None
                }
                (0, 1) => return,
                (1, _) => Some(unescaped(byte)),
                _ => Some(byte),
            };
            match decoded {
                Some(byte) => match pattern.next(matched, &[byte]) {
                    Some(next) => next,
                    None => return,
                },
                None => matched,
            }
        }
    };
    if escape == CLOSED {
        return out.push(stack);
    }
    if chars <= *max {
        stack.frames.push(Frame::Str {
            node,
            chars,
            escape,
            pending,
            matched,
        });
        out.push(stack);
    }
}

/// The letters of JSON's one-letter escapes.
const ESCAPES: [u8; 8] = [b'"', b'\\', b'/', b'b', b'f', b'n', b'r', b't'];

/// The character a one-letter escape (after its backslash) stands for.
fn unescaped(letter: u8) -> u8 {
    match letter {
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        other => other, // `"`, `\`, `/`
    }
}

/// `escape` after the closing quote.
const CLOSED: u8 = u8::MAX;
/// `escape` states of `\\u`: before its first hex digit, before the second after a `d` (no
/// surrogate: a character past U+FFFF is written as UTF-8), before the second, third, fourth.
const HEX_FIRST: u8 = 6;
const HEX_AFTER_D: u8 = 5;

/// A string's state `(chars, escape, pending)` after `byte` (`pending`: UTF-8 continuation
/// bytes owed); `None` if the string cannot take it, `escape` [`CLOSED`] if it ends it.
fn string_byte(
    (chars, escape, pending): (u32, u8, u8),
    byte: u8,
    min: u32,
) -> Option<(u32, u8, u8)> {
    let hex = byte.is_ascii_hexdigit();
    Some(match (escape, byte) {
        (0, 0x80..=0xbf) if pending > 0 => (chars, 0, pending - 1),
        (0, _) if pending > 0 => return None,
        (0, b'"') if chars >= min => (chars, CLOSED, 0),
        // An escape is one character, counted at its backslash (so that a string at its
        // longest cannot begin one).
        (0, b'\\') => (chars + 1, 1, 0),
        (0, 0x20..=0x7f) if byte != b'"' => (chars + 1, 0, 0),
        (0, 0xc2..=0xdf) => (chars + 1, 0, 1),
        (0, 0xe0..=0xef) => (chars + 1, 0, 2),
        (0, 0xf0..=0xf4) => (chars + 1, 0, 3),
        (1, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => (chars, 0, 0),
        (1, b'u') => (chars, HEX_FIRST, 0),
        (HEX_FIRST, b'd' | b'D') => (chars, HEX_AFTER_D, 0),
        (HEX_FIRST, _) if hex => (chars, 4, 0),
        (HEX_AFTER_D, b'0'..=b'7') => (chars, 3, 0),
        (2, _) if hex => (chars, 0, 0),
        (3 | 4, _) if hex => (chars, escape - 1, 0),
        _ => return None,
    })
}

/// Whether `bytes` could follow one another inside a string from a character's start: no
/// quote, backslash or control byte, and UTF-8 (a character may be left unfinished).
pub(crate) fn plain_string_bytes(bytes: &[u8]) -> bool {
    let mut state = (0, 0, 0);
    bytes.iter().all(|&byte| {
        byte != b'\\'
            && string_byte(state, byte, 0).is_some_and(|next| {
                state = next;
                next.1 != CLOSED
            })
    })
}

fn number_kind(schema: &Schema, node: NodeId) -> NumberKind {
    match *schema.node(node) {
        Node::Number { integer, bounds } => NumberKind { integer, bounds },
        ref other => unreachable!("a number frame on {other:?}"),
    }
}

/// Whether `byte` continues a number or literal that could also end here.
fn continues(schema: &Schema, frame: &Frame, byte: u8) -> bool {
    match *frame {
        Frame::Number { node, state } => state.next(number_kind(schema, node), byte).is_some(),
        // A complete literal has no next byte.
        Frame::Literal { node, index, at } => {
            literal(schema, node, index).get(at as usize) == Some(&byte)
        }
        _ => false,
    }
}

/// A value of `node` begins with `byte`.
fn start_value(
    schema: &Schema,
    mut stack: Stack,
    node: NodeId,
    byte: u8,
    out: &mut Vec<Stack>,
    nesting: u8,
) {
    if stack.frames.len() >= MAX_DEPTH {
        return;
    }
    let frame = match schema.node(node) {
        Node::Union(alternatives) => {
            if nesting < MAX_UNION_NESTING {
                for &alternative in alternatives {
                    start_value(schema, stack.clone(), alternative, byte, out, nesting + 1);
                }
            }
            return;
        }
        Node::Object { .. } if byte == b'{' => Frame::Object {
            node,
            next: 0,
            current: FREE_KEY,
            stage: ObjectStage::Open,
        },
        Node::Array { .. } if byte == b'[' => Frame::Array {
            node,
            count: 0,
            stage: ArrayStage::Open,
        },
        Node::String { pattern, .. } if byte == b'"' => Frame::Str {
            node,
            chars: 0,
            escape: 0,
            pending: 0,
            matched: pattern.as_ref().map_or(0, |p| p.start()),
        },
        Node::Number { .. } => match NumberState::start(number_kind(schema, node), byte) {
            Some(state) => Frame::Number { node, state },
            None => return,
        },
        Node::Literals(values) => {
            for (index, value) in values.iter().enumerate() {
                if value.first() == Some(&byte) {
                    let mut fork = stack.clone();
                    fork.frames.push(Frame::Literal {
                        node,
                        index: index as u16,
                        at: 1,
                    });
                    out.push(fork);
                }
            }
            return;
        }
        _ => return,
    };
    stack.frames.push(frame);
    out.push(stack);
}

/// An object's listed properties that may come next after `next`: up to and including the
/// first required one still to come.
fn candidates(
    properties: &[super::schema::Property],
    next: u16,
) -> impl Iterator<Item = usize> + '_ {
    let start = next as usize;
    let end = properties[start..]
        .iter()
        .position(|p| p.required)
        .map_or(properties.len(), |i| start + i + 1);
    start..end
}

fn object(
    schema: &Schema,
    mut stack: Stack,
    (node, next, current, stage): (NodeId, u16, u16, ObjectStage),
    byte: u8,
    out: &mut Vec<Stack>,
) {
    let Node::Object {
        properties,
        other_values,
    } = schema.node(node)
    else {
        unreachable!("an object frame on a non-object");
    };
    let free = properties.is_empty();
    // Every required property is written: the object may close.
    let closable = free || !properties[next as usize..].iter().any(|p| p.required);
    let more = if free {
        other_values.is_some()
    } else {
        (next as usize) < properties.len()
    };
    let frame = |next, current, stage| Frame::Object {
        node,
        next,
        current,
        stage,
    };
    match (stage, byte) {
        (ObjectStage::Open | ObjectStage::AfterValue, b'}') if closable => out.push(stack),
        (ObjectStage::Open | ObjectStage::Comma, b'"') if more => {
            if free {
                stack.frames.push(frame(next, FREE_KEY, ObjectStage::Colon));
                stack.frames.push(Frame::Str {
                    node: ANY_STRING,
                    chars: 0,
                    escape: 0,
                    pending: 0,
                    matched: 0,
                });
                return out.push(stack);
            }
            for property in candidates(properties, next) {
                let mut fork = stack.clone();
                let property = property as u16;
                fork.frames
                    .push(frame(property + 1, property, ObjectStage::Colon));
                fork.frames.push(Frame::Key {
                    node,
                    property,
                    at: 1,
                });
                out.push(fork);
            }
        }
        (ObjectStage::Colon, b':') => {
            let value = match current {
                FREE_KEY => other_values.expect("a free key has a value schema"),
                property => properties[property as usize].value,
            };
            stack
                .frames
                .push(frame(next, current, ObjectStage::AfterValue));
            stack.frames.push(Frame::Value(value));
            out.push(stack);
        }
        (ObjectStage::AfterValue, b',') if more => {
            stack.frames.push(frame(next, current, ObjectStage::Comma));
            out.push(stack);
        }
        _ => {}
    }
}

fn array(
    schema: &Schema,
    mut stack: Stack,
    (node, count, stage): (NodeId, u32, ArrayStage),
    byte: u8,
    out: &mut Vec<Stack>,
) {
    let &Node::Array { items, min, max } = schema.node(node) else {
        unreachable!("an array frame on a non-array");
    };
    let frame = |count, stage| Frame::Array { node, count, stage };
    match (stage, byte) {
        (ArrayStage::Open | ArrayStage::AfterValue, b']') if count >= min => out.push(stack),
        (ArrayStage::AfterValue, b',') if count < max => {
            stack.frames.push(frame(count, ArrayStage::Comma));
            out.push(stack);
        }
        (ArrayStage::Open | ArrayStage::Comma, _) if count < max => {
            stack.frames.push(frame(count + 1, ArrayStage::AfterValue));
            start_value(schema, stack, items, byte, out, 0);
        }
        _ => {}
    }
}
