//! Test fabric.
