//! The `CNI_*` environment, validated per command.
//!
//! Each command gets only the variables it needs (DEL tolerates an empty `CNI_NETNS`; VERSION,
//! GC and STATUS need nothing but `CNI_COMMAND`, so podman's `dummy` values are never looked at).
//! Every missing or invalid variable is named in one code-4 error.

use crate::CniError;

/// The verb in `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "GC" => Self::Gc,
            "STATUS" => Self::Status,
            "VERSION" => Self::Version,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Gc => "GC",
            Self::Status => "STATUS",
            Self::Version => "VERSION",
        }
    }
}

/// Environment of ADD and CHECK: everything is required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachEnv {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    /// Raw `CNI_ARGS` (parse with [`crate::CniArgs::parse`]).
    pub args: String,
}

/// Environment of DEL: the netns may be gone, so it is optional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelEnv {
    pub container_id: String,
    pub netns: Option<String>,
    pub ifname: String,
    pub args: String,
}

/// A validated invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    Add(AttachEnv),
    Del(DelEnv),
    Check(AttachEnv),
    Gc,
    Status,
    Version,
}

impl Invocation {
    pub fn command(&self) -> Command {
        match self {
            Self::Add(_) => Command::Add,
            Self::Del(_) => Command::Del,
            Self::Check(_) => Command::Check,
            Self::Gc => Command::Gc,
            Self::Status => Command::Status,
            Self::Version => Command::Version,
        }
    }

    /// Read and validate the environment through `get` (normally `std::env::var`).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, CniError> {
        let cmd = match get("CNI_COMMAND") {
            None => return Err(CniError::env("missing environment variable CNI_COMMAND")),
            Some(c) => Command::parse(&c).ok_or_else(|| {
                CniError::env(format!(
                    "invalid CNI_COMMAND {c:?}: expected ADD, DEL, CHECK, GC, STATUS or VERSION"
                ))
            })?,
        };
        let mut problems = Vec::new();
        let netns_required = matches!(cmd, Command::Add | Command::Check);
        let mut take =
            |name: &str, required: bool, check: fn(&str) -> Result<(), String>| match get(name)
                .filter(|v| !v.is_empty())
            {
                None if required => {
                    problems.push(format!("{name} is missing or empty"));
                    None
                }
                None => None,
                Some(v) => match check(&v) {
                    Ok(()) => Some(v),
                    Err(why) => {
                        problems.push(format!("{name}={v:?} is invalid: {why}"));
                        None
                    }
                },
            };
        let inv = match cmd {
            Command::Version => return Ok(Self::Version),
            Command::Gc => return Ok(Self::Gc),
            Command::Status => return Ok(Self::Status),
            Command::Add | Command::Check | Command::Del => {
                let container_id = take("CNI_CONTAINERID", true, validate_container_id);
                let netns = take("CNI_NETNS", netns_required, validate_netns);
                let ifname = take("CNI_IFNAME", true, validate_ifname);
                let args = get("CNI_ARGS").unwrap_or_default();
                match (container_id, ifname) {
                    (Some(container_id), Some(ifname)) if problems.is_empty() => match cmd {
                        Command::Del => Self::Del(DelEnv {
                            container_id,
                            netns,
                            ifname,
                            args,
                        }),
                        _ => {
                            let env = AttachEnv {
                                container_id,
                                netns: netns.expect("required and checked"),
                                ifname,
                                args,
                            };
                            if cmd == Command::Add {
                                Self::Add(env)
                            } else {
                                Self::Check(env)
                            }
                        }
                    },
                    _ => {
                        return Err(CniError::env(format!(
                            "invalid environment for {}: {}",
                            cmd.as_str(),
                            problems.join("; ")
                        )))
                    }
                }
            }
        };
        Ok(inv)
    }
}

/// As libcni's `ValidateContainerID`: alphanumeric first, then alphanumerics, `_`, `.`, `-`.
pub fn validate_container_id(id: &str) -> Result<(), String> {
    let mut chars = id.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphanumeric() => {}
        _ => return Err("must start with a letter or digit".into()),
    }
    if chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        Ok(())
    } else {
        Err("only letters, digits, '_', '.' and '-' are allowed".into())
    }
}

/// As libcni's `ValidateInterfaceName`: 1..=15 bytes, not `.`/`..`, no `/`, `:` or whitespace.
pub fn validate_ifname(name: &str) -> Result<(), String> {
    if name.len() > 15 {
        return Err("longer than 15 bytes".into());
    }
    if name == "." || name == ".." {
        return Err("'.' and '..' are not interface names".into());
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err("contains '/', ':' or whitespace".into());
    }
    Ok(())
}

fn validate_netns(path: &str) -> Result<(), String> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err("must be an absolute path".into())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Invocation, CniError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Invocation::from_lookup(|k| m.get(k).cloned())
    }

    const ADD: [(&str, &str); 5] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/var/run/netns/cni-1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];

    #[test]
    fn add_ok() {
        let Invocation::Add(env) = parse(&ADD).unwrap() else {
            panic!("not ADD")
        };
        assert_eq!(env.container_id, "abc123");
        assert_eq!(env.netns, "/var/run/netns/cni-1");
        assert_eq!(env.ifname, "eth0");
    }

    #[test]
    fn bad_env_table() {
        // (overrides, names the message must contain)
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: &[Case] = &[
            (&[("CNI_COMMAND", "")], &["CNI_COMMAND"]),
            (&[("CNI_COMMAND", "add")], &["CNI_COMMAND"]),
            (&[("CNI_CONTAINERID", "")], &["CNI_CONTAINERID"]),
            (&[("CNI_CONTAINERID", "-x")], &["CNI_CONTAINERID"]),
            (&[("CNI_CONTAINERID", "a b")], &["CNI_CONTAINERID"]),
            (&[("CNI_IFNAME", "")], &["CNI_IFNAME"]),
            (&[("CNI_IFNAME", "a-very-long-ifname")], &["CNI_IFNAME"]),
            (&[("CNI_IFNAME", "a/b")], &["CNI_IFNAME"]),
            (&[("CNI_IFNAME", "..")], &["CNI_IFNAME"]),
            (&[("CNI_NETNS", "")], &["CNI_NETNS"]),
            (&[("CNI_NETNS", "netns-1")], &["CNI_NETNS"]),
            (
                &[("CNI_NETNS", ""), ("CNI_IFNAME", "")],
                &["CNI_NETNS", "CNI_IFNAME"],
            ),
        ];
        for (overrides, names) in cases {
            let mut vars: Vec<(&str, &str)> = ADD
                .iter()
                .filter(|(k, _)| !overrides.iter().any(|(o, _)| o == k))
                .copied()
                .collect();
            vars.extend(overrides.iter().filter(|(_, v)| !v.is_empty()).copied());
            let err = parse(&vars).unwrap_err();
            assert_eq!(err.code, 4, "{overrides:?}");
            for n in *names {
                assert!(err.msg.contains(n), "{overrides:?}: {}", err.msg);
            }
        }
    }

    #[test]
    fn del_tolerates_empty_netns_and_check_requires_it() {
        let mut vars = ADD.to_vec();
        vars[0] = ("CNI_COMMAND", "DEL");
        vars[2] = ("CNI_NETNS", "");
        let Invocation::Del(env) = parse(&vars).unwrap() else {
            panic!("not DEL")
        };
        assert_eq!(env.netns, None);
        vars[0] = ("CNI_COMMAND", "CHECK");
        assert_eq!(parse(&vars).unwrap_err().code, 4);
    }

    #[test]
    fn version_gc_status_ignore_dummy_values() {
        for (cmd, want) in [
            ("VERSION", Invocation::Version),
            ("GC", Invocation::Gc),
            ("STATUS", Invocation::Status),
        ] {
            let vars = [
                ("CNI_COMMAND", cmd),
                ("CNI_NETNS", "dummy"),
                ("CNI_IFNAME", "dummy"),
                ("CNI_PATH", "dummy"),
            ];
            assert_eq!(parse(&vars).unwrap(), want);
        }
    }
}
