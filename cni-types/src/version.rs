//! CNI spec versions this plugin accepts and the differences between them that matter here.

use std::fmt;

use crate::CniError;

/// A supported `cniVersion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

/// Every supported version, oldest first (the VERSION answer).
pub const SUPPORTED_VERSIONS: [CniVersion; 5] = [
    CniVersion::V0_3_0,
    CniVersion::V0_3_1,
    CniVersion::V0_4_0,
    CniVersion::V1_0_0,
    CniVersion::V1_1_0,
];

impl CniVersion {
    pub const LATEST: Self = Self::V1_1_0;

    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_3_0 => "0.3.0",
            Self::V0_3_1 => "0.3.1",
            Self::V0_4_0 => "0.4.0",
            Self::V1_0_0 => "1.0.0",
            Self::V1_1_0 => "1.1.0",
        }
    }

    /// Parse a version string; an unknown one is a code-1 error.
    pub fn parse(s: &str) -> Result<Self, CniError> {
        SUPPORTED_VERSIONS
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                CniError::version(format!(
                    "unsupported cniVersion {s:?}; supported: {}",
                    SUPPORTED_VERSIONS.map(|v| v.as_str()).join(", ")
                ))
            })
    }

    /// 0.3.x and 0.4.0 results carry `ips[].version`; 1.x results do not.
    pub fn legacy_result(self) -> bool {
        self < Self::V1_0_0
    }

    /// CHECK exists from 0.4.0 on.
    pub fn has_check(self) -> bool {
        self >= Self::V0_4_0
    }

    /// GC and STATUS exist from 1.1.0 on.
    pub fn has_gc_and_status(self) -> bool {
        self >= Self::V1_1_0
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_features() {
        for v in SUPPORTED_VERSIONS {
            assert_eq!(CniVersion::parse(v.as_str()).unwrap(), v);
        }
        for bad in ["0.2.0", "1.2.0", "", "1.0", "v1.0.0"] {
            assert_eq!(CniVersion::parse(bad).unwrap_err().code, 1, "{bad}");
        }
        assert!(CniVersion::V0_4_0.legacy_result());
        assert!(!CniVersion::V1_0_0.legacy_result());
        assert!(!CniVersion::V0_3_1.has_check());
        assert!(CniVersion::V0_4_0.has_check());
        assert!(!CniVersion::V1_0_0.has_gc_and_status());
        assert!(CniVersion::V1_1_0.has_gc_and_status());
    }
}
