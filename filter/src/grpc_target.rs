//! What the filter names as the upstream of its gRPC calls.
//!
//! Envoy's wasm host reads the upstream of `proxy_grpc_call` as a serialized
//! `envoy.config.core.v3.GrpcService` when the bytes parse as one, else as a
//! cluster name. A bare cluster name makes Envoy send the cluster's name as
//! the call's `:authority`: harmless for `kvsteer_indexer`, fatal for an
//! Istio cluster such as `outbound|9090||kvsteer-indexer.ns.svc.cluster.local`,
//! whose `|` is not allowed in an authority: the calls fail and every pick
//! fails open (`tests/tests/indexer_replicas.rs` runs that cluster name with
//! the authority set). With `indexer_authority`
//! set, the filter sends a `GrpcService { envoy_grpc { cluster_name,
//! authority } }` instead.

/// Longest `cluster_name` + `authority` the encoding below carries: both
/// lengths and the embedded message's length must fit one varint byte
/// (< 128), which also keeps every byte ASCII, as the host call's `&str`
/// requires.
pub const MAX_CLUSTER_AND_AUTHORITY_BYTES: usize = 127 - 4;

/// `GrpcService.envoy_grpc` (field 1), `EnvoyGrpc.cluster_name` (field 1)
/// and `EnvoyGrpc.authority` (field 2), all length-delimited (wire type 2).
const ENVOY_GRPC_TAG: u8 = (1 << 3) | 2;
const CLUSTER_NAME_TAG: u8 = (1 << 3) | 2;
const AUTHORITY_TAG: u8 = (2 << 3) | 2;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error(
        "cluster name and authority together are {0} bytes, at most {MAX_CLUSTER_AND_AUTHORITY_BYTES} fit"
    )]
    TooLong(usize),
    #[error("`{0}` is not a host[:port] authority (letters, digits, `.`, `-`, `:`, `[`, `]`)")]
    BadAuthority(String),
}

/// Checks an authority the way Envoy's and the indexer's HTTP/2 stacks will
/// read it: a host name or IP literal, optionally with a port.
pub fn check_authority(authority: &str) -> Result<(), TargetError> {
    let ok = !authority.is_empty()
        && authority
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        && !authority.starts_with(':');
    if ok {
        Ok(())
    } else {
        Err(TargetError::BadAuthority(authority.to_owned()))
    }
}

/// The upstream string for `cluster`, carrying `authority` when given.
pub fn encode(cluster: &str, authority: Option<&str>) -> Result<String, TargetError> {
    let Some(authority) = authority else {
        return Ok(cluster.to_owned());
    };
    check_authority(authority)?;
    let total = cluster.len() + authority.len();
    if total > MAX_CLUSTER_AND_AUTHORITY_BYTES || !cluster.is_ascii() {
        return Err(TargetError::TooLong(total));
    }
    let inner = 2 + cluster.len() + 2 + authority.len();
    let mut out = String::with_capacity(2 + inner);
    // Every length is below 128 (checked above): one varint byte each, ASCII.
    out.push(char::from(ENVOY_GRPC_TAG));
    out.push(char::from(inner as u8));
    out.push(char::from(CLUSTER_NAME_TAG));
    out.push(char::from(cluster.len() as u8));
    out.push_str(cluster);
    out.push(char::from(AUTHORITY_TAG));
    out.push(char::from(authority.len() as u8));
    out.push_str(authority);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader of the two messages' wire format, independent of `encode`:
    /// (field number, bytes) of each length-delimited field.
    fn fields(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while let [key, rest @ ..] = bytes {
            assert_eq!(key & 7, 2, "wire type must be length-delimited");
            let mut rest = rest;
            let len = prost::encoding::decode_varint(&mut rest).expect("varint") as usize;
            out.push((key >> 3, rest[..len].to_vec()));
            bytes = &rest[len..];
        }
        out
    }

    #[test]
    fn without_an_authority_the_cluster_name_goes_as_is() {
        assert_eq!(encode("kvsteer_indexer", None).unwrap(), "kvsteer_indexer");
    }

    #[test]
    fn with_an_authority_a_grpc_service_names_both() {
        let cluster = "outbound|9090||kvsteer-indexer.kvsteer.svc.cluster.local";
        let authority = "kvsteer-indexer.kvsteer.svc.cluster.local:9090";
        let encoded = encode(cluster, Some(authority)).unwrap();
        assert!(encoded.is_ascii());
        let outer = fields(encoded.as_bytes());
        assert_eq!(outer.len(), 1);
        assert_eq!(outer[0].0, 1, "GrpcService.envoy_grpc");
        let inner = fields(&outer[0].1);
        assert_eq!(
            inner,
            vec![
                (1, cluster.as_bytes().to_vec()),
                (2, authority.as_bytes().to_vec())
            ]
        );
    }

    #[test]
    fn the_longest_pair_still_fits_one_byte_lengths() {
        let cluster = "c".repeat(MAX_CLUSTER_AND_AUTHORITY_BYTES - 10);
        let encoded = encode(&cluster, Some("a.b.c:9090")).unwrap();
        assert_eq!(encoded.len(), 127 + 2);
        assert!(encoded.is_ascii());
        assert_eq!(fields(encoded.as_bytes())[0].1.len(), 127);
        let too_long = "c".repeat(MAX_CLUSTER_AND_AUTHORITY_BYTES - 9);
        assert_eq!(
            encode(&too_long, Some("a.b.c:9090")),
            Err(TargetError::TooLong(MAX_CLUSTER_AND_AUTHORITY_BYTES + 1))
        );
    }

    #[test]
    fn authorities_are_host_and_port_only() {
        for good in [
            "idx",
            "kvsteer-indexer.ns.svc:9090",
            "10.0.0.1:9090",
            "[::1]:9090",
        ] {
            assert_eq!(check_authority(good), Ok(()), "{good}");
        }
        for bad in ["", "outbound|9090||x", "a b", ":9090", "host/path", "ünï"] {
            assert!(check_authority(bad).is_err(), "{bad}");
        }
    }
}
