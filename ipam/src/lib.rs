//! aliasnet IPAM.
