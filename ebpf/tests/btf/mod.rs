//! Just enough of ELF and BTF to read the struct layouts and map definitions out of the
//! compiled object. aya-obj parses BTF too but keeps its types crate-private.
//!
//! BTF: a header, then the type section (records of `struct btf_type` followed by
//! kind-specific data, ids from 1), then the string section. See the kernel's
//! Documentation/bpf/btf.rst.

use std::collections::HashMap;

const BTF_MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().expect("2 bytes"))
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// The contents of section `name` of a little-endian ELF64 file.
pub fn elf_section<'a>(elf: &'a [u8], name: &str) -> Option<&'a [u8]> {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "not ELF64");
    assert_eq!(elf[5], 1, "not little-endian");
    let shoff = u64_at(elf, 0x28) as usize;
    let shentsize = usize::from(u16_at(elf, 0x3a));
    let shnum = usize::from(u16_at(elf, 0x3c));
    let shstrndx = usize::from(u16_at(elf, 0x3e));
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(elf, header(shstrndx) + 24) as usize;
    (0..shnum).find_map(|i| {
        let h = header(i);
        let name_off = strtab + u32_at(elf, h) as usize;
        let end = name_off + elf[name_off..].iter().position(|&c| c == 0)?;
        if &elf[name_off..end] != name.as_bytes() {
            return None;
        }
        let (off, size) = (u64_at(elf, h + 24) as usize, u64_at(elf, h + 32) as usize);
        Some(&elf[off..off + size])
    })
}

/// One BTF type record: its kind, name, `size` or `type` field, and its member-like entries
/// as (name, type, offset) — struct members (offset in bits), array (elem, -, nelems),
/// datasec entries (var type, offset, size).
#[derive(Debug, Clone)]
pub struct Type {
    pub kind: u32,
    pub name: String,
    pub size_or_type: u32,
    pub members: Vec<(String, u32, u32)>,
}

pub struct Btf {
    /// Index = type id; id 0 is void.
    types: Vec<Type>,
}

/// A struct member: name, byte offset and byte size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub offset: usize,
    pub size: usize,
}

/// A map definition from the `.maps` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapDef {
    pub kind: u32,
    pub key_size: usize,
    pub value_size: usize,
    pub key_type: String,
    pub value_type: String,
    pub max_entries: u32,
    pub flags: u32,
}

impl Btf {
    pub fn parse(b: &[u8]) -> Self {
        assert_eq!(u16_at(b, 0), BTF_MAGIC, "BTF magic");
        let hdr_len = u32_at(b, 4) as usize;
        let (type_off, type_len) = (u32_at(b, 8) as usize, u32_at(b, 12) as usize);
        let (str_off, str_len) = (u32_at(b, 16) as usize, u32_at(b, 20) as usize);
        let strings = &b[hdr_len + str_off..hdr_len + str_off + str_len];
        let string = |off: u32| {
            let s = &strings[off as usize..];
            let end = s
                .iter()
                .position(|&c| c == 0)
                .expect("NUL-terminated string");
            String::from_utf8(s[..end].to_vec()).expect("UTF-8 name")
        };
        let data = &b[hdr_len + type_off..hdr_len + type_off + type_len];
        let mut types = vec![Type {
            kind: 0,
            name: "void".into(),
            size_or_type: 0,
            members: vec![],
        }];
        let mut at = 0;
        while at < data.len() {
            let info = u32_at(data, at + 4);
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let mut t = Type {
                kind,
                name: string(u32_at(data, at)),
                size_or_type: u32_at(data, at + 8),
                members: vec![],
            };
            at += 12;
            // Records of `size` bytes: (name_off, type or value, third word if any).
            let entries = |size: usize, at: &mut usize, members: &mut Vec<_>| {
                for _ in 0..vlen {
                    let e = *at;
                    let third = if size == 12 { u32_at(data, e + 8) } else { 0 };
                    members.push((string(u32_at(data, e)), u32_at(data, e + 4), third));
                    *at += size;
                }
            };
            match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => at += 4,
                KIND_ARRAY => {
                    // struct btf_array { type, index_type, nelems }
                    let (elem, nelems) = (u32_at(data, at), u32_at(data, at + 8));
                    t.members.push((String::new(), elem, nelems));
                    at += 12;
                }
                KIND_STRUCT | KIND_UNION | KIND_ENUM64 => entries(12, &mut at, &mut t.members),
                KIND_ENUM | KIND_FUNC_PROTO => entries(8, &mut at, &mut t.members),
                KIND_DATASEC => {
                    // struct btf_var_secinfo { type, offset, size }: no name.
                    for _ in 0..vlen {
                        let ty = u32_at(data, at);
                        t.members.push((String::new(), ty, u32_at(data, at + 4)));
                        at += 12;
                    }
                }
                _ => {}
            }
            types.push(t);
        }
        Self { types }
    }

    fn get(&self, id: u32) -> &Type {
        &self.types[id as usize]
    }

    /// Skips typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> u32 {
        while matches!(
            self.get(id).kind,
            KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
        ) {
            id = self.get(id).size_or_type;
        }
        id
    }

    pub fn size_of(&self, id: u32) -> usize {
        let t = self.get(self.resolve(id));
        match t.kind {
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 => {
                t.size_or_type as usize
            }
            KIND_PTR => 8,
            KIND_ARRAY => {
                let (_, elem, nelems) = &t.members[0];
                self.size_of(*elem) * *nelems as usize
            }
            k => panic!("no size for BTF kind {k} ({})", t.name),
        }
    }

    /// A type's name as C spells it: `struct x`, `__u32`, `char[16]`.
    pub fn type_name(&self, id: u32) -> String {
        let t = self.get(id);
        match t.kind {
            KIND_STRUCT => format!("struct {}", t.name),
            KIND_UNION => format!("union {}", t.name),
            KIND_ARRAY => {
                let (_, elem, nelems) = &t.members[0];
                format!("{}[{nelems}]", self.type_name(*elem))
            }
            KIND_PTR => format!("{} *", self.type_name(t.size_or_type)),
            _ => t.name.clone(),
        }
    }

    /// The id of the struct named `name`.
    pub fn struct_id(&self, name: &str) -> Option<u32> {
        (0..self.types.len() as u32).find(|&id| {
            let t = self.get(id);
            t.kind == KIND_STRUCT && t.name == name
        })
    }

    /// Size and members of struct `name`, if the object's BTF has it.
    pub fn struct_layout(&self, name: &str) -> Option<(usize, Vec<Member>)> {
        let id = self.struct_id(name)?;
        let t = self.get(id);
        let members = t
            .members
            .iter()
            .map(|(name, ty, offset)| {
                assert_eq!(offset % 8, 0, "{name}: bit field");
                Member {
                    name: name.clone(),
                    offset: (offset / 8) as usize,
                    size: self.size_of(*ty),
                }
            })
            .collect();
        Some((t.size_or_type as usize, members))
    }

    /// The map definitions of the `.maps` section, by map name. `__uint(name, n)` is encoded
    /// as `int (*name)[n]`, `__type(name, T)` as `T *name`.
    pub fn maps(&self) -> HashMap<String, MapDef> {
        let sec = self
            .types
            .iter()
            .find(|t| t.kind == KIND_DATASEC && t.name == ".maps")
            .expect(".maps section in BTF");
        sec.members
            .iter()
            .map(|(_, var, _)| {
                let var = self.get(*var);
                let def = self.get(self.resolve(var.size_or_type));
                let field = |name: &str| {
                    def.members
                        .iter()
                        .find(|(n, _, _)| n == name)
                        .map(|(_, ty, _)| self.get(*ty).size_or_type)
                };
                let uint = |name: &str| {
                    field(name).map(|ptr| {
                        let arr = self.get(ptr);
                        assert_eq!(arr.kind, KIND_ARRAY, "{name} is __uint");
                        arr.members[0].2
                    })
                };
                let key = field("key").expect("__type(key, ...)");
                let value = field("value").expect("__type(value, ...)");
                (
                    var.name.clone(),
                    MapDef {
                        kind: uint("type").expect("map type"),
                        key_size: self.size_of(key),
                        value_size: self.size_of(value),
                        key_type: self.type_name(key),
                        value_type: self.type_name(value),
                        max_entries: uint("max_entries").expect("max_entries"),
                        flags: uint("map_flags").unwrap_or(0),
                    },
                )
            })
            .collect()
    }
}
