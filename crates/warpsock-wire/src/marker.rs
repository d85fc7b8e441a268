//! MPA markers (RFC 5044 §4.3, §5). Placeholder while the rules are confirmed.
