//! Issue 17 §5: TLS with client-certificate verification on the
//! filter→indexer gRPC, through a real Envoy 1.40 with the kvsteer filter, a
//! real indexer (`grpc.tls`) and three simulated workers. With Envoy's client
//! certificate, picks and reports succeed; an Envoy without one is refused in
//! the handshake and its requests fail open (steered by round robin, no
//! pick). Certificates are made at run time with the `openssl` CLI.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use kvsteer_e2e::{Cluster, ClusterOptions, MODEL, Paths, chat_body, serial, wait_until};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
/// The name Envoy expects in the indexer's certificate.
const INDEXER_NAME: &str = "kvsteer-indexer";

/// A CA, the indexer's server certificate and Envoy's client certificate.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> anyhow::Result<Pki> {
        let pki = Pki {
            dir: tempfile::Builder::new().prefix("kvsteer-pki-").tempdir()?,
        };
        pki.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=kvsteer test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ])?;
        pki.leaf(
            "server",
            &format!(
                "subjectAltName=DNS:{INDEXER_NAME},IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
            ),
        )?;
        pki.leaf(
            "client",
            "subjectAltName=DNS:envoy.kvsteer.test\nextendedKeyUsage=clientAuth\n",
        )?;
        Ok(pki)
    }

    /// `NAME.key` and `NAME.pem`, signed by the CA with `extensions`.
    fn leaf(&self, name: &str, extensions: &str) -> anyhow::Result<()> {
        let ext = format!("{name}.ext");
        std::fs::write(self.path(&ext), extensions)?;
        self.openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ])?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &ext,
            "-out",
            &format!("{name}.pem"),
        ])
    }

    fn openssl(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new("openssl")
            .current_dir(self.dir.path())
            .args(args)
            .output()
            .context("running openssl (is it installed?)")?;
        ensure!(out.status.success(), "openssl {args:?}: {out:?}");
        Ok(())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn file(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// The indexer's `grpc.tls` section (under `grpc:`).
    fn indexer_tls(&self) -> String {
        format!(
            "  tls:\n    cert_file: {}\n    key_file: {}\n    client_ca_file: {}",
            self.file("server.pem"),
            self.file("server.key"),
            self.file("ca.pem")
        )
    }

    /// `envoy/local/envoy.yaml` with a TLS transport socket on the indexer
    /// cluster: Envoy checks the indexer's name against the CA and presents
    /// its client certificate unless `with_client_cert` is false.
    fn envoy_config(&self, with_client_cert: bool) -> anyhow::Result<PathBuf> {
        let root = Paths::discover()?.root;
        let text = std::fs::read_to_string(root.join("envoy/local/envoy.yaml"))?;
        let anchor = "    - name: kvsteer_indexer\n      type: STATIC\n";
        ensure!(text.contains(anchor), "envoy.yaml: no indexer cluster");
        let cert = if with_client_cert {
            format!(
                "
            tls_certificates:
              - certificate_chain: {{ filename: {} }}
                private_key: {{ filename: {} }}",
                self.file("client.pem"),
                self.file("client.key")
            )
        } else {
            String::new()
        };
        let socket = format!(
            "      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: {INDEXER_NAME}
          common_tls_context:
            alpn_protocols: [h2]{cert}
            validation_context:
              trusted_ca: {{ filename: {ca} }}
              match_typed_subject_alt_names:
                - san_type: DNS
                  matcher: {{ exact: {INDEXER_NAME} }}
",
            ca = self.file("ca.pem")
        );
        let name = if with_client_cert {
            "envoy-mtls.yaml"
        } else {
            "envoy-nocert.yaml"
        };
        let path = self.path(name);
        std::fs::write(&path, text.replace(anchor, &format!("{anchor}{socket}")))?;
        Ok(path)
    }
}

async fn start(pki: &Pki, with_client_cert: bool) -> Cluster {
    Cluster::start(ClusterOptions {
        envoy_config: Some(pki.envoy_config(with_client_cert).expect("envoy config")),
        grpc_extra: pki.indexer_tls(),
        ..ClusterOptions::tiny(8.0)
    })
    .await
    .expect("cluster")
}

async fn metric(c: &Cluster, name: &str, labels: &[&str]) -> f64 {
    c.indexer_metric(name, labels)
        .await
        .expect("indexer metrics")
}

async fn chat(c: &Cluster, text: &str) -> u16 {
    let body = chat_body(MODEL, &json!([{"role": "user", "content": text}]), 4);
    let resp = c
        .client
        .post(c.envoy_url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("request through Envoy");
    let status = resp.status().as_u16();
    resp.bytes().await.expect("response body");
    status
}

/// The filter's fail-open counters, all reasons.
async fn fail_opens(c: &Cluster) -> u64 {
    let text = c
        .client
        .get("http://127.0.0.1:9901/stats")
        .query(&[("filter", "kvsteer_filter_failopen")])
        .send()
        .await
        .expect("envoy stats")
        .text()
        .await
        .expect("envoy stats");
    text.lines()
        .filter_map(|l| l.split_once(": "))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picks_and_reports_flow_over_mutual_tls() {
    let _serial = serial().await;
    let pki = Pki::new().expect("certificates");
    let c = start(&pki, true).await;
    for i in 0..3 {
        assert_eq!(chat(&c, &format!("over TLS {i}")).await, 200);
    }
    assert_eq!(
        metric(&c, "kvsteer_picks_total", &["outcome=\"routed\""]).await,
        3.0
    );
    assert_eq!(fail_opens(&c).await, 0);
    wait_until("three done reports", WAIT, || async {
        (metric(&c, "kvsteer_reports_total", &["kind=\"done\""]).await == 3.0).then_some(())
    })
    .await
    .expect("reports reach the indexer over TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_without_a_client_certificate_is_refused() {
    let _serial = serial().await;
    let pki = Pki::new().expect("certificates");
    let c = start(&pki, false).await;
    for i in 0..3 {
        // Fail open: the request is served, unsteered.
        assert_eq!(chat(&c, &format!("no cert {i}")).await, 200);
    }
    assert_eq!(metric(&c, "kvsteer_picks_total", &[]).await, 0.0);
    assert!(fail_opens(&c).await >= 3);
}

#[test]
fn the_generated_certificates_chain_to_the_ca() {
    let pki = Pki::new().expect("certificates");
    for leaf in ["server.pem", "client.pem"] {
        let out = Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(pki.path("ca.pem"))
            .arg(pki.path(leaf))
            .output()
            .expect("openssl verify");
        assert!(out.status.success(), "{leaf}: {out:?}");
    }
}
