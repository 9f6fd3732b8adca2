//! The text form of a CRUSH map, as `crushtool -d` writes it and `crushtool -c` reads it:
//! tunables, devices (with classes), types, buckets (`id`, `id N class C`, `alg`, `hash`,
//! `item NAME [weight W] [pos P]`), rules (`id`/`ruleset`, `type`, `min_size`, `max_size`,
//! steps) and `choose_args` weight sets, compiled to the same [`CrushMap`] `crushtool -c` would
//! encode: weights converted as Ceph converts them (single-precision `W * 65536`, truncated),
//! derived bucket arrays from [`crate::builder`], bucket slots grown by doubling, device-class
//! shadow trees built when the first rule is read, and the map's device count taken from its
//! buckets and device names.
//!
//! [`parse`] reads text, [`load`] takes either form (a compiled map starts with its magic).
//! Every error names the line and column of the offending token; nothing panics. Accepted
//! beyond crushtool's grammar: rules without `min_size`/`max_size` (defaults 1 and 10, as
//! newer Ceph releases omit them) and negative `choose_args` indices (the default weight set,
//! -1, which `crushtool -d` prints).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::builder::{add_item, item_weight, make_bucket};
use crate::decode::{decode, CRUSH_MAGIC, MAX_DEVICES};
use crate::error::CrushError;
use crate::map::{
    op, Bucket, ChooseArg, CrushMap, Rule, Step, Tunables, ALG_LIST, ALG_STRAW, ALG_STRAW2,
    ALG_TREE, ALG_UNIFORM,
};

/// Largest bucket slot count a text map may ask for (ids down to `-MAX_BUCKETS`).
pub const MAX_BUCKETS: i64 = 1 << 16;

/// Rule ids fit Ceph's one-byte ruleset.
pub const MAX_RULES: i64 = 256;

/// `CRUSH_MAX_DEVICE_WEIGHT`: 100.0 in 16.16 fixed point.
const MAX_DEVICE_WEIGHT: u32 = 100 * 0x10000;
/// `CRUSH_MAX_BUCKET_WEIGHT`: 65535.0 in 16.16 fixed point.
const MAX_BUCKET_WEIGHT: u32 = 65535 * 0x10000;

/// Reads a map in either form: compiled (starts with the CRUSH magic) or text.
pub fn load(bytes: &[u8]) -> Result<CrushMap, CrushError> {
    if bytes.len() >= 4 && bytes[..4] == CRUSH_MAGIC.to_le_bytes() {
        return decode(bytes);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let before = &bytes[..e.valid_up_to()];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let col = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
        CrushError::Parse {
            line,
            column: col,
            message: "neither a compiled CRUSH map (no magic) nor UTF-8 text".into(),
        }
    })?;
    parse(text)
}

/// Compiles the text form of a map.
pub fn parse(src: &str) -> Result<CrushMap, CrushError> {
    let toks = lex(src);
    let end = end_pos(src);
    let mut p = Parser {
        toks: &toks,
        at: 0,
        end,
    };
    let items = p.crushmap()?;
    let mut c = Compiler::new(&items);
    for item in &items {
        c.item(item)?;
    }
    c.finish(end)
}

// ---------------------------------------------------------------- tokens

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pos {
    line: usize,
    col: usize,
}

#[derive(Debug, Clone, Copy)]
struct Tok<'a> {
    text: &'a str,
    pos: Pos,
}

fn err(pos: Pos, message: impl Into<String>) -> CrushError {
    CrushError::Parse {
        line: pos.line,
        column: pos.col,
        message: message.into(),
    }
}

fn end_pos(src: &str) -> Pos {
    let line = src.matches('\n').count() + 1;
    let col = src.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Pos { line, col }
}

/// Splits into words and the single-character tokens `{ } [ ]`; `#` starts a comment that
/// runs to the end of the line.
fn lex(src: &str) -> Vec<Tok<'_>> {
    let mut toks = Vec::new();
    for (li, line) in src.split('\n').enumerate() {
        let mut chars = line.char_indices().enumerate().peekable();
        while let Some((ci, (bi, ch))) = chars.next() {
            let pos = Pos {
                line: li + 1,
                col: ci + 1,
            };
            if ch == '#' {
                break;
            }
            if ch.is_whitespace() {
                continue;
            }
            if matches!(ch, '{' | '}' | '[' | ']') {
                toks.push(Tok {
                    text: &line[bi..bi + 1],
                    pos,
                });
                continue;
            }
            let mut end = bi + ch.len_utf8();
            while let Some(&(_, (bj, cj))) = chars.peek() {
                if cj.is_whitespace() || matches!(cj, '{' | '}' | '[' | ']' | '#') {
                    break;
                }
                end = bj + cj.len_utf8();
                chars.next();
            }
            toks.push(Tok {
                text: &line[bi..end],
                pos,
            });
        }
    }
    toks
}

// ---------------------------------------------------------------- syntax

/// A word with where it stood.
#[derive(Debug, Clone)]
struct Word {
    text: String,
    pos: Pos,
}

#[derive(Debug, Clone)]
enum BucketLine {
    Id {
        id: i32,
        class: Option<Word>,
        pos: Pos,
    },
    Alg(Word),
    Hash {
        hash: u8,
    },
    Item {
        name: Word,
        weight: Option<(f32, Pos)>,
        pos_in_bucket: Option<(i64, Pos)>,
    },
}

#[derive(Debug, Clone)]
enum StepSyntax {
    Take { item: Word, class: Option<Word> },
    Set { op: u32, value: i32 },
    Choose { op: u32, n: i32, ty: Word },
    Emit,
}

#[derive(Debug, Clone)]
struct ChooseArgSyntax {
    bucket_id: i32,
    pos: Pos,
    weight_set: Option<Vec<(Vec<f32>, Pos)>>,
    ids: Option<(Vec<i32>, Pos)>,
}

#[derive(Debug, Clone)]
enum Item {
    Tunable {
        name: Word,
        value: i64,
    },
    Device {
        id: i32,
        name: Word,
        class: Option<Word>,
    },
    Type {
        id: i32,
        name: Word,
    },
    Bucket {
        ty: Word,
        name: Word,
        lines: Vec<BucketLine>,
    },
    Rule {
        pos: Pos,
        name: Option<Word>,
        id: (i64, Pos),
        rule_type: u8,
        min_size: i64,
        max_size: i64,
        steps: Vec<(StepSyntax, Pos)>,
    },
    ChooseArgs {
        index: (i64, Pos),
        args: Vec<ChooseArgSyntax>,
    },
}

struct Parser<'t, 'a> {
    toks: &'t [Tok<'a>],
    at: usize,
    end: Pos,
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl<'t, 'a> Parser<'t, 'a> {
    fn peek(&self) -> Option<Tok<'a>> {
        self.toks.get(self.at).copied()
    }

    fn next(&mut self, what: &str) -> Result<Tok<'a>, CrushError> {
        match self.peek() {
            Some(t) => {
                self.at += 1;
                Ok(t)
            }
            None => Err(err(
                self.end,
                format!("unexpected end of input, expected {what}"),
            )),
        }
    }

    fn is(&self, word: &str) -> bool {
        self.peek().is_some_and(|t| t.text == word)
    }

    fn expect(&mut self, word: &str) -> Result<Pos, CrushError> {
        let t = self.next(&format!("'{word}'"))?;
        if t.text != word {
            return Err(err(t.pos, format!("expected '{word}', found '{}'", t.text)));
        }
        Ok(t.pos)
    }

    /// Reads the token after an item of a `{ ... }` block (`within` names the block in errors):
    /// `start`, which opens another item, gives true; `}`, which closes the block, false.
    fn another(&mut self, start: &str, within: &str) -> Result<bool, CrushError> {
        let t = self.next(&format!("'{start}' or '}}'"))?;
        match t.text {
            "}" => Ok(false),
            s if s == start => Ok(true),
            other => Err(err(
                t.pos,
                format!("expected '{start}' or '}}' in {within}, found '{other}'"),
            )),
        }
    }

    /// The value `value` reads after keyword `word` when `word` comes next (and is consumed),
    /// `None` when it does not.
    fn optional<T>(
        &mut self,
        word: &str,
        value: impl FnOnce(&mut Self) -> Result<T, CrushError>,
    ) -> Result<Option<T>, CrushError> {
        if !self.is(word) {
            return Ok(None);
        }
        self.at += 1;
        value(self).map(Some)
    }

    fn name(&mut self, what: &str) -> Result<Word, CrushError> {
        let t = self.next(what)?;
        if !valid_name(t.text) {
            return Err(err(
                t.pos,
                format!(
                    "expected {what} (letters, digits, '-', '_', '.'), found '{}'",
                    t.text
                ),
            ));
        }
        Ok(Word {
            text: t.text.to_string(),
            pos: t.pos,
        })
    }

    /// An integer in `lo..=hi`.
    fn int(&mut self, what: &str, lo: i64, hi: i64) -> Result<(i64, Pos), CrushError> {
        let t = self.next(what)?;
        let digits = t.text.strip_prefix('-').unwrap_or(t.text);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(
                t.pos,
                format!("expected {what} (an integer), found '{}'", t.text),
            ));
        }
        let v: i64 = t.text.parse().unwrap_or(i64::MAX);
        if v < lo || v > hi {
            return Err(err(
                t.pos,
                format!("{what} {} is out of range ({lo}..={hi})", t.text),
            ));
        }
        Ok((v, t.pos))
    }

    /// A non-negative decimal number, as `strtof` reads it.
    fn real(&mut self, what: &str) -> Result<(f32, Pos), CrushError> {
        let t = self.next(what)?;
        let ok = !t.text.is_empty()
            && t.text.bytes().any(|b| b.is_ascii_digit())
            && t.text
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
        let v = if ok { t.text.parse::<f32>().ok() } else { None };
        match v {
            Some(v) if v.is_finite() && v >= 0.0 => Ok((v, t.pos)),
            Some(_) => Err(err(
                t.pos,
                format!("{what} '{}' must be a finite number >= 0", t.text),
            )),
            None => Err(err(
                t.pos,
                format!("expected {what} (a number), found '{}'", t.text),
            )),
        }
    }

    fn crushmap(&mut self) -> Result<Vec<Item>, CrushError> {
        let mut items = Vec::new();
        while let Some(t) = self.peek() {
            let item = match t.text {
                "tunable" => {
                    self.at += 1;
                    let name = self.name("a tunable name")?;
                    let (value, _) = self.int("a tunable value", 0, u32::MAX as i64)?;
                    Item::Tunable { name, value }
                }
                "device" => {
                    self.at += 1;
                    let (id, _) = self.int("a device id", 0, MAX_DEVICES as i64 - 1)?;
                    let name = self.name("a device name")?;
                    let class = self.optional("class", |p| p.name("a device class"))?;
                    Item::Device {
                        id: id as i32,
                        name,
                        class,
                    }
                }
                "type" => {
                    self.at += 1;
                    let (id, _) = self.int("a type id", 0, u16::MAX as i64)?;
                    let name = self.name("a type name")?;
                    Item::Type {
                        id: id as i32,
                        name,
                    }
                }
                "rule" => self.rule()?,
                "choose_args" => self.choose_args()?,
                _ => self.bucket()?,
            };
            items.push(item);
        }
        Ok(items)
    }

    fn bucket(&mut self) -> Result<Item, CrushError> {
        let ty = self.name("a bucket type (or tunable, device, type, rule, choose_args)")?;
        let name = self.name("a bucket name")?;
        self.expect("{")?;
        let mut lines = Vec::new();
        loop {
            let t = self.next("a bucket line or '}'")?;
            match t.text {
                "}" => break,
                "id" => {
                    let (id, _) = self.int("a bucket id", -MAX_BUCKETS, -1)?;
                    let class = self.optional("class", |p| p.name("a device class"))?;
                    lines.push(BucketLine::Id {
                        id: id as i32,
                        class,
                        pos: t.pos,
                    });
                }
                "alg" => lines.push(BucketLine::Alg(self.name("a bucket algorithm")?)),
                "hash" => {
                    let hash = if self.is("rjenkins1") {
                        self.at += 1;
                        0
                    } else {
                        self.int("a hash (0 or rjenkins1)", 0, 255)?.0 as u8
                    };
                    lines.push(BucketLine::Hash { hash });
                }
                "item" => {
                    let name = self.name("an item name")?;
                    let weight = self.optional("weight", |p| p.real("an item weight"))?;
                    let pos_in_bucket =
                        self.optional("pos", |p| p.int("an item position", 0, i32::MAX as i64))?;
                    lines.push(BucketLine::Item {
                        name,
                        weight,
                        pos_in_bucket,
                    });
                }
                other => {
                    return Err(err(
                        t.pos,
                        format!(
                            "expected id, alg, hash, item or '}}' in a bucket, found '{other}'"
                        ),
                    ))
                }
            }
        }
        Ok(Item::Bucket { ty, name, lines })
    }

    fn rule(&mut self) -> Result<Item, CrushError> {
        let pos = self.expect("rule")?;
        let name = if self.is("{") {
            None
        } else {
            Some(self.name("a rule name")?)
        };
        self.expect("{")?;
        let t = self.next("'id' or 'ruleset'")?;
        if t.text != "id" && t.text != "ruleset" {
            return Err(err(
                t.pos,
                format!("expected 'id' or 'ruleset', found '{}'", t.text),
            ));
        }
        let id = self.int("a rule id", 0, MAX_RULES - 1)?;
        self.expect("type")?;
        let t = self.next("a rule type")?;
        let rule_type = match t.text {
            "replicated" => 1,
            "erasure" => 3,
            other => {
                return Err(err(
                    t.pos,
                    format!("rule type must be replicated or erasure, not '{other}'"),
                ))
            }
        };
        let mut min_size = 1;
        let mut max_size = 10;
        if self.is("min_size") {
            self.at += 1;
            min_size = self.int("min_size", 0, u32::MAX as i64)?.0;
        }
        if self.is("max_size") {
            self.at += 1;
            max_size = self.int("max_size", 0, u32::MAX as i64)?.0;
        }
        let mut steps = Vec::new();
        while self.another("step", "a rule")? {
            let s = self.next("a step")?;
            let set = |op: u32| Some(op);
            let set_op = match s.text {
                "set_choose_tries" => set(op::SET_CHOOSE_TRIES),
                "set_chooseleaf_tries" => set(op::SET_CHOOSELEAF_TRIES),
                "set_choose_local_tries" => set(op::SET_CHOOSE_LOCAL_TRIES),
                "set_choose_local_fallback_tries" => set(op::SET_CHOOSE_LOCAL_FALLBACK_TRIES),
                "set_chooseleaf_vary_r" => set(op::SET_CHOOSELEAF_VARY_R),
                "set_chooseleaf_stable" => set(op::SET_CHOOSELEAF_STABLE),
                _ => None,
            };
            let step = if let Some(op) = set_op {
                let (value, _) = self.int("a step value", 0, i32::MAX as i64)?;
                StepSyntax::Set {
                    op,
                    value: value as i32,
                }
            } else {
                match s.text {
                    "take" => {
                        let item = self.name("an item to take")?;
                        let class = self.optional("class", |p| p.name("a device class"))?;
                        StepSyntax::Take { item, class }
                    }
                    "choose" | "chooseleaf" => {
                        let m = self.next("firstn or indep")?;
                        let leaf = s.text == "chooseleaf";
                        let op = match (m.text, leaf) {
                            ("firstn", false) => op::CHOOSE_FIRSTN,
                            ("indep", false) => op::CHOOSE_INDEP,
                            ("firstn", true) => op::CHOOSELEAF_FIRSTN,
                            ("indep", true) => op::CHOOSELEAF_INDEP,
                            (other, _) => {
                                return Err(err(
                                    m.pos,
                                    format!("expected firstn or indep, found '{other}'"),
                                ))
                            }
                        };
                        let (n, _) =
                            self.int("a replica count", i32::MIN as i64, i32::MAX as i64)?;
                        self.expect("type")?;
                        let ty = self.name("a type name")?;
                        StepSyntax::Choose {
                            op,
                            n: n as i32,
                            ty,
                        }
                    }
                    "emit" => StepSyntax::Emit,
                    other => return Err(err(s.pos, format!("unknown step '{other}'"))),
                }
            };
            steps.push((step, s.pos));
        }
        if steps.is_empty() {
            return Err(err(pos, "a rule needs at least one step"));
        }
        Ok(Item::Rule {
            pos,
            name,
            id,
            rule_type,
            min_size,
            max_size,
            steps,
        })
    }

    fn choose_args(&mut self) -> Result<Item, CrushError> {
        self.expect("choose_args")?;
        let index = self.int("a choose_args index", i64::MIN, i64::MAX)?;
        self.expect("{")?;
        let mut args = Vec::new();
        while self.another("{", "choose_args")? {
            self.expect("bucket_id")?;
            let (bucket_id, pos) = self.int("a bucket id", -MAX_BUCKETS, -1)?;
            let mut a = ChooseArgSyntax {
                bucket_id: bucket_id as i32,
                pos,
                weight_set: None,
                ids: None,
            };
            if self.is("weight_set") {
                self.at += 1;
                self.expect("[")?;
                let mut sets = Vec::new();
                while !self.is("]") {
                    let p = self.expect("[")?;
                    let mut ws = Vec::new();
                    while !self.is("]") {
                        ws.push(self.real("a weight")?.0);
                    }
                    self.at += 1;
                    sets.push((ws, p));
                }
                self.at += 1;
                a.weight_set = Some(sets);
            }
            if self.is("ids") {
                let p = self.expect("ids")?;
                self.expect("[")?;
                let mut ids = Vec::new();
                while !self.is("]") {
                    ids.push(self.int("an id", i32::MIN as i64, i32::MAX as i64)?.0 as i32);
                }
                self.at += 1;
                a.ids = Some((ids, p));
            }
            self.expect("}")?;
            args.push(a);
        }
        Ok(Item::ChooseArgs { index, args })
    }
}

// ---------------------------------------------------------------- compiling

struct Compiler {
    map: CrushMap,
    type_id: HashMap<String, i32>,
    item_id: HashMap<String, i32>,
    /// Ids some bucket declares (`id` lines), reserved before any bucket is built.
    id_used: BTreeSet<i32>,
    /// Weights of the buckets built so far, for items listed without a weight.
    item_weight: HashMap<i32, u32>,
    /// Shadow bucket ids the text asks for: bucket -> class -> id.
    old_class_bucket: BTreeMap<i32, BTreeMap<i32, i32>>,
    saw_rule: bool,
}

/// Ceph's 16.16 conversion of a text weight: single-precision product, truncated.
fn fixed(w: f32) -> Option<u32> {
    let v = w * 65536.0f32;
    (v < 4_294_967_296.0f32).then_some(v as u32)
}

impl Compiler {
    fn new(items: &[Item]) -> Compiler {
        let mut id_used = BTreeSet::new();
        for it in items {
            if let Item::Bucket { lines, .. } = it {
                for l in lines {
                    match l {
                        BucketLine::Id { id, .. } => {
                            id_used.insert(*id);
                        }
                        _ => break,
                    }
                }
            }
        }
        Compiler {
            map: CrushMap {
                buckets: Vec::new(),
                rules: Vec::new(),
                max_devices: 0,
                tunables: Tunables::legacy(),
                type_names: BTreeMap::new(),
                item_names: BTreeMap::new(),
                rule_names: BTreeMap::new(),
                class_map: BTreeMap::new(),
                class_names: BTreeMap::new(),
                class_buckets: BTreeMap::new(),
                choose_args: BTreeMap::new(),
            },
            type_id: HashMap::new(),
            item_id: HashMap::new(),
            id_used,
            item_weight: HashMap::new(),
            old_class_bucket: BTreeMap::new(),
            saw_rule: false,
        }
    }

    fn class_id(&self, name: &str) -> Option<i32> {
        self.map
            .class_names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| *id)
    }

    fn class_or_create(&mut self, name: &str) -> i32 {
        if let Some(c) = self.class_id(name) {
            return c;
        }
        let id = self
            .map
            .class_names
            .keys()
            .next_back()
            .map_or(0, |last| last + 1);
        self.map.class_names.insert(id, name.to_string());
        id
    }

    /// Puts a bucket in its slot, growing the slot array by doubling as Ceph does.
    fn add_bucket(&mut self, b: Bucket) -> Result<(), String> {
        let slot = (-1i64 - b.id as i64) as usize;
        while slot >= self.map.buckets.len() {
            let n = if self.map.buckets.is_empty() {
                8
            } else {
                self.map.buckets.len() * 2
            };
            if n as i64 > 2 * MAX_BUCKETS {
                return Err(format!("bucket id {} is too far from 0", b.id));
            }
            self.map.buckets.resize(n, None);
        }
        if self.map.buckets[slot].is_some() {
            return Err(format!("duplicate bucket id {}", b.id));
        }
        self.map.buckets[slot] = Some(b);
        Ok(())
    }

    fn item(&mut self, item: &Item) -> Result<(), CrushError> {
        match item {
            Item::Tunable { name, value } => self.tunable(name, *value),
            Item::Device { id, name, class } => {
                if self.item_id.contains_key(&name.text) {
                    return Err(err(name.pos, format!("item {} defined twice", name.text)));
                }
                self.item_id.insert(name.text.clone(), *id);
                self.map.item_names.insert(*id, name.text.clone());
                if let Some(c) = class {
                    let cid = self.class_or_create(&c.text);
                    self.map.class_map.insert(*id, cid);
                }
                Ok(())
            }
            Item::Type { id, name } => {
                self.map.type_names.insert(*id, name.text.clone());
                self.type_id.insert(name.text.clone(), *id);
                Ok(())
            }
            Item::Bucket { ty, name, lines } => {
                if self.saw_rule {
                    return Err(err(ty.pos, "buckets must be defined before rules"));
                }
                self.bucket(ty, name, lines)
            }
            Item::Rule {
                pos,
                name,
                id,
                rule_type,
                min_size,
                max_size,
                steps,
            } => {
                if !self.saw_rule {
                    self.saw_rule = true;
                    self.populate_classes().map_err(|e| {
                        err(*pos, format!("building device-class shadow trees: {e}"))
                    })?;
                }
                self.rule(name.as_ref(), *id, *rule_type, *min_size, *max_size, steps)
            }
            Item::ChooseArgs { index, args } => self.choose_args(*index, args),
        }
    }

    fn tunable(&mut self, name: &Word, value: i64) -> Result<(), CrushError> {
        let t = &mut self.map.tunables;
        let v = value as u32;
        match name.text.as_str() {
            "choose_local_tries" => t.choose_local_tries = v,
            "choose_local_fallback_tries" => t.choose_local_fallback_tries = v,
            "choose_total_tries" => t.choose_total_tries = v,
            "chooseleaf_descend_once" => t.chooseleaf_descend_once = v,
            "chooseleaf_vary_r" => t.chooseleaf_vary_r = v as u8,
            "chooseleaf_stable" => t.chooseleaf_stable = v as u8,
            "straw_calc_version" => t.straw_calc_version = v as u8,
            "allowed_bucket_algs" => t.allowed_bucket_algs = v,
            other => {
                return Err(err(name.pos, format!("tunable {other} not recognized")));
            }
        }
        Ok(())
    }

    fn bucket(&mut self, ty: &Word, name: &Word, lines: &[BucketLine]) -> Result<(), CrushError> {
        let Some(&type_id) = self.type_id.get(&ty.text) else {
            return Err(err(
                ty.pos,
                format!("bucket type '{}' is not defined", ty.text),
            ));
        };
        if self.item_id.contains_key(&name.text) {
            return Err(err(
                name.pos,
                format!("bucket or device '{}' is already defined", name.text),
            ));
        }
        let mut id = 0i32;
        let mut alg: Option<u8> = None;
        let mut hash = 0u8;
        let mut class_id: BTreeMap<i32, i32> = BTreeMap::new();
        // First pass: the positions items ask for, and the item count.
        let mut used = BTreeSet::new();
        let mut count = 0usize;
        for l in lines {
            if let BucketLine::Item {
                pos_in_bucket,
                name: iname,
                ..
            } = l
            {
                if let Some((p, pp)) = pos_in_bucket {
                    if !used.insert(*p) {
                        return Err(err(
                            *pp,
                            format!(
                                "item '{}' in bucket '{}' has explicit pos {p}, which is occupied",
                                iname.text, name.text
                            ),
                        ));
                    }
                }
                count += 1;
            }
        }
        let size = count.max(used.iter().next_back().map_or(0, |&p| p as usize));
        let mut items = vec![0i32; size];
        let mut weights = vec![0u32; size];
        let mut curpos = 0i64;
        let mut uniform_weight: Option<u32> = None;
        let mut bucket_weight = 0u32;
        for l in lines {
            match l {
                BucketLine::Id {
                    id: maybe,
                    class,
                    pos,
                } => match class {
                    Some(c) => {
                        let cid = self.class_or_create(&c.text);
                        if class_id.insert(cid, *maybe).is_some() {
                            return Err(err(
                                *pos,
                                format!(
                                    "duplicate device class {} for bucket {}",
                                    c.text, name.text
                                ),
                            ));
                        }
                    }
                    None => id = *maybe,
                },
                BucketLine::Alg(a) => {
                    alg = Some(match a.text.as_str() {
                        "uniform" => ALG_UNIFORM,
                        "list" => ALG_LIST,
                        "tree" => ALG_TREE,
                        "straw" => ALG_STRAW,
                        "straw2" => ALG_STRAW2,
                        other => return Err(err(a.pos, format!("unknown bucket alg '{other}'"))),
                    })
                }
                BucketLine::Hash { hash: h } => hash = *h,
                BucketLine::Item {
                    name: iname,
                    weight,
                    pos_in_bucket,
                } => {
                    let Some(&item) = self.item_id.get(&iname.text) else {
                        return Err(err(
                            iname.pos,
                            format!(
                                "item '{}' in bucket '{}' is not defined",
                                iname.text, name.text
                            ),
                        ));
                    };
                    let mut w = self.item_weight.get(&item).copied().unwrap_or(0x10000);
                    if let Some((f, wp)) = weight {
                        let Some(v) = fixed(*f) else {
                            return Err(err(*wp, "item weight does not fit 32 bits"));
                        };
                        if item >= 0 && v > MAX_DEVICE_WEIGHT {
                            return Err(err(*wp, "device weight limited to 100"));
                        }
                        if item < 0 && v > MAX_BUCKET_WEIGHT {
                            return Err(err(
                                *wp,
                                "bucket weight limited to 65535 to prevent overflow",
                            ));
                        }
                        w = v;
                    }
                    if alg == Some(ALG_UNIFORM) {
                        match uniform_weight {
                            None => uniform_weight = Some(w),
                            Some(u) if u != w => {
                                return Err(err(
                                    iname.pos,
                                    format!(
                                        "item '{}' in uniform bucket '{}' has weight {w} but \
                                         previous item(s) have weight {u}; uniform bucket \
                                         items must all have identical weights",
                                        iname.text, name.text
                                    ),
                                ))
                            }
                            Some(_) => {}
                        }
                    }
                    let p = match pos_in_bucket {
                        Some((p, pp)) => {
                            if *p as usize >= size {
                                return Err(err(
                                    *pp,
                                    format!(
                                        "item '{}' in bucket '{}' has pos {p} >= size {size}",
                                        iname.text, name.text
                                    ),
                                ));
                            }
                            *p
                        }
                        None => {
                            while used.contains(&curpos) {
                                curpos += 1;
                            }
                            curpos += 1;
                            curpos - 1
                        }
                    };
                    items[p as usize] = item;
                    weights[p as usize] = w;
                    bucket_weight = bucket_weight.checked_add(w).ok_or_else(|| {
                        err(
                            iname.pos,
                            format!("bucket '{}' weight overflows 32 bits", name.text),
                        )
                    })?;
                }
            }
        }
        let Some(alg) = alg else {
            return Err(err(
                name.pos,
                format!("bucket '{}' must specify alg", name.text),
            ));
        };
        if id == 0 {
            id = -1;
            while self.id_used.contains(&id) {
                id -= 1;
            }
        }
        for (&cid, &shadow) in &class_id {
            self.old_class_bucket
                .entry(id)
                .or_default()
                .insert(cid, shadow);
        }
        self.id_used.insert(id);
        self.item_id.insert(name.text.clone(), id);
        self.item_weight.insert(id, bucket_weight);
        let b = make_bucket(
            id,
            alg,
            hash,
            type_id as u16,
            &items,
            &weights,
            self.map.tunables.straw_calc_version,
        )
        .map_err(|e| err(name.pos, e.to_string()))?;
        self.add_bucket(b).map_err(|e| err(name.pos, e))?;
        self.map.item_names.insert(id, name.text.clone());
        Ok(())
    }

    /// Ceph's `populate_classes`: a shadow copy of every tree under a root, per class.
    fn populate_classes(&mut self) -> Result<(), CrushError> {
        let used: BTreeSet<i32> = self
            .old_class_bucket
            .values()
            .flat_map(|m| m.values().copied())
            .collect();
        let contained: BTreeSet<i32> = self
            .map
            .buckets
            .iter()
            .flatten()
            .flat_map(|b| b.items.iter().copied())
            .collect();
        let roots: Vec<i32> = self
            .map
            .buckets
            .iter()
            .flatten()
            .map(|b| b.id)
            .filter(|id| !contained.contains(id))
            .filter(|id| !self.map.item_names.get(id).is_some_and(|n| n.contains('~')))
            .collect::<BTreeSet<i32>>()
            .into_iter()
            .collect();
        let classes: Vec<i32> = self.map.class_names.keys().copied().collect();
        for r in roots {
            for &c in &classes {
                self.clone_for_class(r, c, &used, 0)?;
            }
        }
        Ok(())
    }

    fn clone_for_class(
        &mut self,
        original: i32,
        class: i32,
        used: &BTreeSet<i32>,
        depth: usize,
    ) -> Result<i32, CrushError> {
        if depth > 1000 {
            return Err(CrushError::Invalid("bucket hierarchy too deep".into()));
        }
        let name = self
            .map
            .item_names
            .get(&original)
            .cloned()
            .ok_or_else(|| CrushError::Invalid(format!("bucket {original} has no name")))?;
        let class_name = self
            .map
            .class_names
            .get(&class)
            .cloned()
            .unwrap_or_default();
        let copy_name = format!("{name}~{class_name}");
        if let Some((&id, _)) = self.map.item_names.iter().find(|(_, n)| **n == copy_name) {
            return Ok(id);
        }
        let orig = self
            .map
            .bucket(original)
            .cloned()
            .ok_or_else(|| CrushError::Invalid(format!("bucket {original} does not exist")))?;
        let scv = self.map.tunables.straw_calc_version;
        let mut copy = make_bucket(
            0,
            orig.kind.alg(),
            orig.hash,
            orig.bucket_type,
            &[],
            &[],
            scv,
        )?;
        for (i, &item) in orig.items.iter().enumerate() {
            if item >= 0 {
                if self.map.class_map.get(&item) == Some(&class) {
                    add_item(&mut copy, item, item_weight(&orig, i), scv)?;
                }
            } else {
                let child = self.clone_for_class(item, class, used, depth + 1)?;
                let w = self.map.bucket(child).map_or(0, |b| b.weight);
                add_item(&mut copy, child, w, scv)?;
            }
        }
        let id = match self
            .old_class_bucket
            .get(&original)
            .and_then(|m| m.get(&class))
        {
            Some(&id) => id,
            None => {
                let mut id = -1i32;
                while self.map.bucket(id).is_some() || used.contains(&id) {
                    id -= 1;
                }
                id
            }
        };
        copy.id = id;
        self.add_bucket(copy).map_err(CrushError::Invalid)?;
        self.map.class_map.insert(id, class);
        self.map.item_names.insert(id, copy_name);
        self.map
            .class_buckets
            .entry(original)
            .or_default()
            .insert(class, id);
        Ok(id)
    }

    fn rule(
        &mut self,
        name: Option<&Word>,
        (id, id_pos): (i64, Pos),
        rule_type: u8,
        min_size: i64,
        max_size: i64,
        steps: &[(StepSyntax, Pos)],
    ) -> Result<(), CrushError> {
        let rname = name.map_or(String::new(), |n| n.text.clone());
        if let Some(n) = name {
            if self.map.rule_names.values().any(|v| *v == n.text) {
                return Err(err(
                    n.pos,
                    format!("rule name '{}' already defined", n.text),
                ));
            }
        }
        if self.map.rule(id as u32).is_some() {
            return Err(err(id_pos, format!("rule {id} already exists")));
        }
        let mut out = Vec::with_capacity(steps.len());
        for (s, pos) in steps {
            let step = match s {
                StepSyntax::Take { item, class } => {
                    let Some(mut iid) = self.item_id.get(&item.text).copied() else {
                        return Err(err(
                            item.pos,
                            format!("in rule '{rname}' item '{}' not defined", item.text),
                        ));
                    };
                    if let Some(c) = class {
                        let Some(cid) = self.class_id(&c.text) else {
                            return Err(err(
                                c.pos,
                                format!("in rule '{rname}' device class '{}' not defined", c.text),
                            ));
                        };
                        let Some(cb) = self.map.class_buckets.get(&iid) else {
                            return Err(err(
                                item.pos,
                                format!(
                                    "in rule '{rname}' step take {} has no class information",
                                    item.text
                                ),
                            ));
                        };
                        let Some(&shadow) = cb.get(&cid) else {
                            return Err(err(
                                c.pos,
                                format!(
                                    "in rule '{rname}' step take {} no matching bucket for class {}",
                                    item.text, c.text
                                ),
                            ));
                        };
                        iid = shadow;
                    }
                    Step {
                        op: op::TAKE,
                        arg1: iid,
                        arg2: 0,
                    }
                }
                StepSyntax::Set { op, value } => Step {
                    op: *op,
                    arg1: *value,
                    arg2: 0,
                },
                StepSyntax::Choose { op, n, ty } => {
                    let Some(&t) = self.type_id.get(&ty.text) else {
                        return Err(err(
                            ty.pos,
                            format!("in rule '{rname}' type '{}' not defined", ty.text),
                        ));
                    };
                    Step {
                        op: *op,
                        arg1: *n,
                        arg2: t,
                    }
                }
                StepSyntax::Emit => Step {
                    op: op::EMIT,
                    arg1: 0,
                    arg2: 0,
                },
            };
            let _ = pos;
            out.push(step);
        }
        let idx = id as usize;
        if idx >= self.map.rules.len() {
            self.map.rules.resize(idx + 1, None);
        }
        self.map.rules[idx] = Some(Rule {
            ruleset: id as u8,
            rule_type,
            min_size: min_size as u8,
            max_size: max_size as u8,
            steps: out,
        });
        if let Some(n) = name {
            self.map.rule_names.insert(id as i32, n.text.clone());
        }
        Ok(())
    }

    fn choose_args(
        &mut self,
        (index, ipos): (i64, Pos),
        args: &[ChooseArgSyntax],
    ) -> Result<(), CrushError> {
        if self.map.choose_args.contains_key(&index) {
            return Err(err(ipos, format!("choose_args {index} duplicated")));
        }
        let mut out = vec![ChooseArg::default(); self.map.buckets.len()];
        for a in args {
            let slot = (-1i64 - a.bucket_id as i64) as usize;
            let Some(b) = self.map.bucket(a.bucket_id) else {
                return Err(err(a.pos, format!("bucket {} does not exist", a.bucket_id)));
            };
            let size = b.items.len();
            let arg = &mut out[slot];
            if let Some(sets) = &a.weight_set {
                arg.weight_set.clear();
                for (ws, p) in sets {
                    if ws.len() != size {
                        return Err(err(
                            *p,
                            format!(
                                "{} needs exactly {size} weights but got {}",
                                a.bucket_id,
                                ws.len()
                            ),
                        ));
                    }
                    let mut v = Vec::with_capacity(size);
                    for &w in ws {
                        v.push(fixed(w).ok_or_else(|| err(*p, "weight does not fit 32 bits"))?);
                    }
                    arg.weight_set.push(v);
                }
            }
            if let Some((ids, p)) = &a.ids {
                if ids.len() != size {
                    return Err(err(
                        *p,
                        format!(
                            "{} needs exactly {size} ids but got {}",
                            a.bucket_id,
                            ids.len()
                        ),
                    ));
                }
                arg.ids = ids.clone();
            }
        }
        self.map.choose_args.insert(index, out);
        Ok(())
    }

    fn finish(mut self, end: Pos) -> Result<CrushMap, CrushError> {
        let mut max_devices = 0i32;
        for b in self.map.buckets.iter().flatten() {
            for &it in &b.items {
                if it >= max_devices {
                    max_devices = it + 1;
                }
            }
        }
        if let Some((&last, _)) = self.map.item_names.iter().next_back() {
            if last >= max_devices {
                max_devices = last + 1;
            }
        }
        self.map.max_devices = max_devices;
        self.map
            .validate()
            .map_err(|e| err(end, format!("compiled map is invalid: {e}")))?;
        Ok(self.map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = "device 0 osd.0\ndevice 3 osd.3 class ssd\ntype 0 osd\ntype 1 root\n\
        root r {\n\tid -3\n\talg straw2\n\titem osd.0 weight 1.5\n\titem osd.3\n}\n\
        rule x {\n\tid 2\n\ttype replicated\n\tmin_size 1\n\tmax_size 10\n\tstep take r\n\
        \tstep choose firstn 0 type osd\n\tstep emit\n}\n";

    #[test]
    fn a_small_map_compiles_as_crushtool_would() {
        let m = parse(SMALL).expect("parses");
        assert_eq!(m.buckets.len(), 8, "slots grow by doubling from 8");
        assert_eq!(m.rules.len(), 3);
        assert_eq!(m.max_devices, 4);
        let b = m.bucket(-3).expect("bucket -3");
        assert_eq!(b.weight, 0x18000 + 0x10000);
        assert_eq!(m.tunables, Tunables::legacy());
        // One class, so one shadow root with osd.3 only.
        let shadow = m.class_buckets[&-3][&0];
        assert_eq!(m.item_names[&shadow], "r~ssd");
        assert_eq!(m.bucket(shadow).expect("shadow").items, vec![3]);
    }

    #[test]
    fn errors_name_line_and_column() {
        let bad = SMALL.replace("item osd.3", "item osd.9");
        match parse(&bad) {
            Err(CrushError::Parse { line, column, .. }) => assert_eq!((line, column), (9, 7)),
            other => panic!("expected a parse error, got {other:?}"),
        }
        let cut = &SMALL[..SMALL.len() - 3];
        assert!(matches!(parse(cut), Err(CrushError::Parse { .. })));
        assert!(matches!(
            parse("tunable choose_total_tries x\n"),
            Err(CrushError::Parse {
                line: 1,
                column: 28,
                ..
            })
        ));
    }

    #[test]
    fn a_stray_word_in_a_block_is_named_with_the_block() {
        let message = |text: &str| match parse(text) {
            Err(CrushError::Parse { message, .. }) => message,
            other => panic!("expected a parse error, got {other:?}"),
        };
        let rule = SMALL.replace("\tstep emit\n}", "\tstep emit\n\tstap emit\n}");
        assert_eq!(
            message(&rule),
            "expected 'step' or '}' in a rule, found 'stap'"
        );
        let args = format!("{SMALL}choose_args 0 {{\n\tbucket_id -3\n}}\n");
        assert_eq!(
            message(&args),
            "expected '{' or '}' in choose_args, found 'bucket_id'"
        );
        let cut = SMALL.replace("\tstep emit\n}\n", "\tstep emit\n");
        assert!(
            message(&cut).contains("expected 'step' or '}'"),
            "{}",
            message(&cut)
        );
    }

    #[test]
    fn load_sniffs_the_form() {
        let m = parse(SMALL).expect("parses");
        let bin = crate::encode(&m);
        assert_eq!(load(&bin).expect("binary"), m);
        assert_eq!(load(SMALL.as_bytes()).expect("text"), m);
        assert!(matches!(
            load(&[0xff, 0xfe, 0x00]),
            Err(CrushError::Parse { .. })
        ));
    }
}
