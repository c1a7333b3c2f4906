//! Issue 17 §1, through a real Envoy 1.40 with the kvsteer filter, a real
//! indexer and three simulated workers: the tenant a pick carries comes only
//! from something Envoy verified. A client-sent `x-tenant-id` never counts
//! (local layout); a JWT verified by `jwt_authn` does (`envoy/jwt/`), and a
//! missing, expired, badly signed or malformed one is rejected with 401 or,
//! under the anonymous rule, passes as nobody's; a trusted hop's header
//! counts only from its address (`envoy/trusted-hop/`).
//!
//! The tenant is read where it lands: the indexer's
//! `kvsteer_picks_total{tenant}` (allowlist `team-a`, `team-b`; anyone else,
//! and no tenant, is `other`). Keys and tokens are minted at run time with
//! the `openssl` CLI (RS256); no private key is committed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, ensure};
use kvsteer_e2e::{Cluster, ClusterOptions, MODEL, Paths, chat_body, serial};
use serde_json::{Value, json};

const ISSUER: &str = "https://issuer.kvsteer.invalid";
const AUDIENCE: &str = "kvsteer";

// === keys and tokens ===

/// An RSA key pair made for one test, in its own scratch directory.
struct Signer {
    dir: tempfile::TempDir,
    kid: String,
}

impl Signer {
    fn new(kid: &str) -> anyhow::Result<Signer> {
        let dir = tempfile::Builder::new().prefix("kvsteer-jwt-").tempdir()?;
        openssl(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            path_str(&dir.path().join("key.pem"))?,
        ])?;
        Ok(Signer {
            dir,
            kid: kid.to_owned(),
        })
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("key.pem")
    }

    /// The public key as a JWKS document.
    fn jwks(&self) -> anyhow::Result<String> {
        let out = openssl(&["rsa", "-in", path_str(&self.key())?, "-noout", "-modulus"])?;
        let hex = out
            .trim()
            .strip_prefix("Modulus=")
            .context("openssl rsa -modulus: no Modulus=")?;
        let modulus = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()?;
        Ok(json!({"keys": [{
            "kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid,
            "n": base64url(&modulus), "e": base64url(&[1, 0, 1]),
        }]})
        .to_string())
    }

    /// A compact RS256 JWS of `claims`.
    fn sign(&self, claims: &Value) -> anyhow::Result<String> {
        let header = json!({"alg": "RS256", "typ": "JWT", "kid": self.kid});
        let input = format!(
            "{}.{}",
            base64url(header.to_string().as_bytes()),
            base64url(claims.to_string().as_bytes())
        );
        let data = self.dir.path().join("input");
        std::fs::write(&data, &input)?;
        let sig = Command::new("openssl")
            .args(["dgst", "-sha256", "-sign"])
            .arg(self.key())
            .arg(&data)
            .output()
            .context("running openssl dgst")?;
        ensure!(sig.status.success(), "openssl dgst: {:?}", sig);
        Ok(format!("{input}.{}", base64url(&sig.stdout)))
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn claims(tenant: &str, exp: u64) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "someone", "tenant": tenant, "exp": exp})
}

fn openssl(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl (is it installed?)")?;
    ensure!(out.status.success(), "openssl {args:?}: {out:?}");
    Ok(String::from_utf8(out.stdout)?)
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("scratch path is not UTF-8")
}

/// Base64url without padding (RFC 7515 §2).
fn base64url(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

#[test]
fn base64url_matches_rfc_4648_vectors() {
    for (raw, encoded) in [
        ("", ""),
        ("f", "Zg"),
        ("fo", "Zm8"),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg"),
        ("fooba", "Zm9vYmE"),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64url(raw.as_bytes()), encoded);
    }
    assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
}

// === the cluster ===

/// A shipped Envoy config with `edit` applied, written to `dir`.
fn envoy_config(
    dir: &Path,
    shipped: &str,
    edit: impl FnOnce(String) -> anyhow::Result<String>,
) -> anyhow::Result<PathBuf> {
    let paths = Paths::discover()?;
    let text = std::fs::read_to_string(paths.root.join(shipped))
        .with_context(|| format!("reading {shipped}"))?;
    let path = dir.join("envoy.yaml");
    std::fs::write(&path, edit(text)?)?;
    Ok(path)
}

/// `envoy/jwt/envoy.yaml` verifying tokens of `signer` instead of the placeholder key.
fn jwt_config(dir: &Path, signer: &Signer, anonymous: bool) -> anyhow::Result<PathBuf> {
    let jwks = signer.jwks()?;
    envoy_config(dir, "envoy/jwt/envoy.yaml", |text| {
        let start = text
            .find("inline_string: '")
            .context("envoy/jwt/envoy.yaml: no inline JWKS")?;
        let end = text[start..]
            .find("'\n")
            .context("envoy/jwt/envoy.yaml: unterminated JWKS")?;
        let mut text = format!(
            "{}inline_string: '{jwks}{}",
            &text[..start],
            &text[start + end..]
        );
        if anonymous {
            let reject = "requires: { provider_name: tenants }";
            ensure!(
                text.contains(reject),
                "envoy/jwt/envoy.yaml: no reject rule"
            );
            text = text.replace(
                reject,
                "requires: { requires_any: { requirements: [ { provider_name: tenants }, \
                 { allow_missing_or_failed: {} } ] } }",
            );
        }
        Ok(text)
    })
}

async fn start(envoy_config: Option<PathBuf>) -> Cluster {
    Cluster::start(ClusterOptions {
        envoy_config,
        ..ClusterOptions::tiny(8.0)
    })
    .await
    .expect("cluster")
}

/// Picks counted per tenant label: (team-a, team-b, other).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Picks(f64, f64, f64);

async fn picks(c: &Cluster) -> Picks {
    let of = |t: &'static str| async move {
        c.indexer_metric("kvsteer_picks_total", &[&format!("tenant=\"{t}\"")])
            .await
            .expect("indexer metrics")
    };
    Picks(of("team-a").await, of("team-b").await, of("other").await)
}

/// Sends one chat request with `headers` through `client` and returns its
/// status and the picks it added per tenant label.
async fn send(
    c: &Cluster,
    client: &reqwest::Client,
    text: &str,
    headers: &[(&str, &str)],
) -> (u16, Picks) {
    let before = picks(c).await;
    let body = chat_body(MODEL, &json!([{"role": "user", "content": text}]), 4);
    let mut req = client.post(c.envoy_url("/v1/chat/completions")).json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request through Envoy");
    let status = resp.status().as_u16();
    resp.bytes().await.expect("response body");
    let after = picks(c).await;
    (
        status,
        Picks(after.0 - before.0, after.1 - before.1, after.2 - before.2),
    )
}

/// Request headers, name and value.
type Headers<'a> = Vec<(&'a str, &'a str)>;

const FORGED: (&str, &str) = ("x-tenant-id", "team-b");
const TEAM_A: Picks = Picks(1.0, 0.0, 0.0);
const NOBODY: Picks = Picks(0.0, 0.0, 1.0);
const NO_PICK: Picks = Picks(0.0, 0.0, 0.0);

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_layout_ignores_a_client_tenant_header() {
    let _serial = serial().await;
    let c = start(None).await;
    let (status, added) = send(&c, &c.client, "forged tenant", &[FORGED]).await;
    assert_eq!((status, added), (200, NOBODY));
    // Over the filter's cap or not, a client's value never counts.
    let long = "a".repeat(4096);
    let (status, added) = send(&c, &c.client, "long tenant", &[("x-tenant-id", &long)]).await;
    assert_eq!((status, added), (200, NOBODY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_tenant_comes_from_a_verified_token_only() {
    let _serial = serial().await;
    let signer = Signer::new("test-key").expect("key");
    let stranger = Signer::new("test-key").expect("second key");
    let scratch = tempfile::tempdir().expect("scratch dir");
    let config = jwt_config(scratch.path(), &signer, false).expect("config");
    let c = start(Some(config)).await;
    let hour = now() + 3600;
    let bearer = |t: &str| format!("Bearer {t}");

    let valid = bearer(&signer.sign(&claims("team-a", hour)).expect("token"));
    let (status, added) = send(&c, &c.client, "valid", &[("authorization", &valid)]).await;
    assert_eq!(
        (status, added),
        (200, TEAM_A),
        "a valid token names the tenant"
    );
    let (status, added) = send(
        &c,
        &c.client,
        "valid+forged",
        &[FORGED, ("authorization", &valid)],
    )
    .await;
    assert_eq!(
        (status, added),
        (200, TEAM_A),
        "a forged header changes nothing"
    );

    // Missing, expired, badly signed, malformed: 401 under the reject rule
    // (a token for another audience: 403, Envoy's answer), before any pick.
    let expired = bearer(&signer.sign(&claims("team-a", now() - 3600)).expect("token"));
    let wrong_key = bearer(&stranger.sign(&claims("team-b", hour)).expect("token"));
    let wrong_aud = bearer(
        &signer
            .sign(&json!({"iss": ISSUER, "aud": "other", "tenant": "team-b", "exp": hour}))
            .expect("token"),
    );
    let cases: [(&str, u16, Headers); 6] = [
        ("missing", 401, vec![FORGED]),
        ("expired", 401, vec![FORGED, ("authorization", &expired)]),
        (
            "wrong key",
            401,
            vec![FORGED, ("authorization", &wrong_key)],
        ),
        (
            "wrong audience",
            403,
            vec![FORGED, ("authorization", &wrong_aud)],
        ),
        (
            "malformed",
            401,
            vec![FORGED, ("authorization", "Bearer not.a.jwt")],
        ),
        (
            "not base64",
            401,
            vec![FORGED, ("authorization", "Bearer !!!")],
        ),
    ];
    for (what, want, headers) in cases {
        let (status, added) = send(&c, &c.client, what, &headers).await;
        assert_eq!((status, added), (want, NO_PICK), "{what}");
    }

    // A verified claim over the filter's cap: steered, as nobody's.
    let long = bearer(&signer.sign(&claims(&"a".repeat(200), hour)).expect("token"));
    let (status, added) = send(&c, &c.client, "long claim", &[("authorization", &long)]).await;
    assert_eq!((status, added), (200, NOBODY));
    // A verified token without the claim: nobody's, whatever the client says.
    let unclaimed = bearer(
        &signer
            .sign(&json!({"iss": ISSUER, "aud": AUDIENCE, "exp": hour}))
            .expect("token"),
    );
    let (status, added) = send(
        &c,
        &c.client,
        "no claim",
        &[FORGED, ("authorization", &unclaimed)],
    )
    .await;
    assert_eq!((status, added), (200, NOBODY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_anonymous_rule_lets_bad_tokens_through_as_nobody() {
    let _serial = serial().await;
    let signer = Signer::new("test-key").expect("key");
    let scratch = tempfile::tempdir().expect("scratch dir");
    let config = jwt_config(scratch.path(), &signer, true).expect("config");
    let c = start(Some(config)).await;

    let valid = format!(
        "Bearer {}",
        signer.sign(&claims("team-a", now() + 3600)).expect("token")
    );
    let (status, added) = send(&c, &c.client, "valid", &[FORGED, ("authorization", &valid)]).await;
    assert_eq!((status, added), (200, TEAM_A));

    let expired = format!(
        "Bearer {}",
        signer.sign(&claims("team-a", now() - 3600)).expect("token")
    );
    let cases: [(&str, Headers); 3] = [
        ("missing", vec![FORGED]),
        ("expired", vec![FORGED, ("authorization", &expired)]),
        ("malformed", vec![FORGED, ("authorization", "Bearer x.y.z")]),
    ];
    for (what, headers) in cases {
        let (status, added) = send(&c, &c.client, what, &headers).await;
        assert_eq!((status, added), (200, NOBODY), "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_hop_header_counts_only_from_its_address() {
    let _serial = serial().await;
    let scratch = tempfile::tempdir().expect("scratch dir");
    let config = envoy_config(scratch.path(), "envoy/trusted-hop/envoy.yaml", Ok).expect("config");
    let c = start(Some(config)).await;
    // The gateway: connections from 127.0.0.2 (any 127/8 address is local).
    let gateway = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");

    let (status, added) = send(&c, &gateway, "from the hop", &[("x-tenant-id", "team-a")]).await;
    assert_eq!((status, added), (200, TEAM_A));
    let (status, added) = send(&c, &c.client, "from a client", &[FORGED]).await;
    assert_eq!((status, added), (200, NOBODY));
    // The filter's cap holds on the trusted path too.
    let long = "a".repeat(129);
    let (status, added) = send(&c, &gateway, "long", &[("x-tenant-id", &long)]).await;
    assert_eq!((status, added), (200, NOBODY));
}
