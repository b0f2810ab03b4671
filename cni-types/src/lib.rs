//! CNI spec types (filled in by the plugin work).
