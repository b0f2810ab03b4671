//! Traffic shaper daemon: arrives with the datapath issue; nothing here yet.
