//! The checks every section's validation shares: each error names its field.

use super::ConfigError;
use std::net::SocketAddr;

pub(super) fn missing(field: &str) -> ConfigError {
    ConfigError::Missing {
        field: field.into(),
    }
}

pub(super) fn invalid(field: &str, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

pub(super) fn duplicate(field: &str, value: &str) -> ConfigError {
    ConfigError::Duplicate {
        field: field.into(),
        value: value.into(),
    }
}

pub(super) fn socket_addr(field: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse()
        .map_err(|_| invalid(field, &format!("{v:?} is not an ip:port address")))
}

pub(super) fn zmq_endpoint(field: &str, v: &str) -> Result<(), ConfigError> {
    let rest = v
        .strip_prefix("tcp://")
        .ok_or_else(|| invalid(field, &format!("{v:?} must start with tcp://")))?;
    match rest.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(invalid(field, &format!("{v:?} needs host:port"))),
    }
}

pub(super) fn positive(field: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(invalid(field, "must be a positive number"))
    }
}

pub(super) fn unit(field: &str, v: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(invalid(field, "must be within 0..=1"))
    }
}
