//! eBPF datapath: C programs and ABI mirrors arrive with the datapath issue; nothing here yet.
