//! vtism guest agent (issue: guest tracker).
