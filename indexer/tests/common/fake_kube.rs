//! A fake Kubernetes API server on loopback for the pod watcher: the real
//! list/watch protocol over HTTP/1.1 (a `PodList` with its
//! resourceVersion; a chunked stream of newline-delimited watch events
//! resumed from a resourceVersion, with bookmarks and `timeoutSeconds`;
//! `410 Gone` for a resourceVersion compacted away), for pods of one
//! namespace, filtered by label selector. It can be stopped (every
//! connection dropped, the port closed) and started again on the same port
//! with the same objects, like an API server restart.

use kvsteer_indexer::discovery::selector;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
    sync::broadcast,
    task::JoinSet,
};

/// How often an open watch gets a bookmark.
const BOOKMARK_EVERY: Duration = Duration::from_millis(300);

#[derive(Default)]
struct State {
    rv: u64,
    pods: BTreeMap<String, Value>,
    /// Every change: (resourceVersion, type, object).
    history: Vec<(u64, &'static str, Value)>,
    /// Watches from below this resourceVersion get 410.
    compacted: u64,
    /// Request paths (with query) served, in order.
    requests: Vec<String>,
}

pub struct FakeKube {
    pub addr: SocketAddr,
    pub namespace: String,
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<(u64, &'static str, Value)>,
    server: Mutex<Option<JoinSet<()>>>,
}

impl FakeKube {
    pub async fn start(namespace: &str) -> Arc<FakeKube> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let kube = Arc::new(FakeKube {
            addr: listener.local_addr().unwrap(),
            namespace: namespace.into(),
            state: Arc::default(),
            events: broadcast::channel(1024).0,
            server: Mutex::new(None),
        });
        kube.serve(listener);
        kube
    }

    fn serve(self: &Arc<Self>, listener: TcpListener) {
        let mut set = JoinSet::new();
        let me = self.clone();
        set.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                conns.spawn(me.clone().connection(stream));
            }
        });
        *self.server.lock() = Some(set);
    }

    /// Drops every connection and closes the port.
    pub async fn stop(&self) {
        let set = self.server.lock().take();
        if let Some(mut set) = set {
            set.shutdown().await;
        }
    }

    /// Listens again on the same port, with the same objects.
    pub async fn restart(self: &Arc<Self>) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    /// A kubeconfig for this server (plain http, no credentials).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: 'http://{addr}'}}\n\
             users:\n- name: test\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: test, namespace: {ns}}}\n\
             current-context: fake\n",
            addr = self.addr,
            ns = self.namespace,
        )
    }

    /// Creates or replaces a pod (`ADDED` or `MODIFIED`).
    pub fn put(&self, mut pod: Value) {
        let mut s = self.state.lock();
        s.rv += 1;
        let rv = s.rv;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        pod["metadata"]["namespace"] = json!(self.namespace);
        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
        let kind = if s.pods.insert(name, pod.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        s.history.push((rv, kind, pod.clone()));
        let _ = self.events.send((rv, kind, pod));
    }

    /// Deletes a pod (`DELETED`).
    pub fn delete(&self, name: &str) {
        let mut s = self.state.lock();
        let Some(mut pod) = s.pods.remove(name) else {
            return;
        };
        s.rv += 1;
        let rv = s.rv;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.history.push((rv, "DELETED", pod.clone()));
        let _ = self.events.send((rv, "DELETED", pod));
    }

    pub fn pod(&self, name: &str) -> Option<Value> {
        self.state.lock().pods.get(name).cloned()
    }

    /// Forgets the history: a watch resumed from an older resourceVersion
    /// gets `410 Gone`, and open watches are ended (as etcd compaction
    /// with a watch cache restart would).
    pub fn compact(&self) {
        let mut s = self.state.lock();
        s.compacted = s.rv + 1;
        s.history.clear();
        let _ = self.events.send((s.rv, "COMPACTED", Value::Null));
    }

    pub fn requests(&self) -> Vec<String> {
        self.state.lock().requests.clone()
    }

    async fn connection(self: Arc<Self>, stream: TcpStream) {
        let (read, mut write) = stream.into_split();
        let mut read = BufReader::new(read);
        loop {
            let mut line = String::new();
            if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            // Headers (a GET has no body).
            loop {
                let mut h = String::new();
                if read.read_line(&mut h).await.unwrap_or(0) == 0 {
                    return;
                }
                if h == "\r\n" || h == "\n" {
                    break;
                }
            }
            let target = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
            self.state.lock().requests.push(target.clone());
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            let q: BTreeMap<String, String> = query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), decode(v)))
                .collect();
            let selector = selector::parse(q.get("labelSelector").map_or("", String::as_str));
            let ok = match selector {
                _ if path != format!("/api/v1/namespaces/{}/pods", self.namespace) => {
                    respond(&mut write, 404, &status(404, "NotFound", path)).await
                }
                Err(_) => {
                    respond(&mut write, 400, &status(400, "BadRequest", "labelSelector")).await
                }
                Ok(reqs) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                    self.watch(&mut write, &q, &reqs).await
                }
                Ok(reqs) => self.list(&mut write, &reqs).await,
            };
            if !ok {
                return;
            }
        }
    }

    async fn list(
        &self,
        write: &mut tokio::net::tcp::OwnedWriteHalf,
        reqs: &[selector::Requirement],
    ) -> bool {
        let body = {
            let s = self.state.lock();
            let items: Vec<&Value> = s.pods.values().filter(|p| selected(reqs, p)).collect();
            json!({
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": s.rv.to_string()},
                "items": items,
            })
        };
        respond(write, 200, &body).await
    }

    async fn watch(
        &self,
        write: &mut tokio::net::tcp::OwnedWriteHalf,
        q: &BTreeMap<String, String>,
        reqs: &[selector::Requirement],
    ) -> bool {
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let timeout = Duration::from_secs(
            q.get("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(300),
        );
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
        if write.write_all(head.as_bytes()).await.is_err() {
            return false;
        }
        // Subscribe before reading the history: nothing falls in between.
        let mut live = self.events.subscribe();
        let (backlog, compacted, mut last) = {
            let s = self.state.lock();
            let backlog: Vec<_> = s
                .history
                .iter()
                .filter(|(rv, ..)| *rv > from)
                .cloned()
                .collect();
            (backlog, from != 0 && from < s.compacted, s.rv.max(from))
        };
        if compacted {
            let gone = json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version")});
            let _ = chunk(write, &gone).await;
            return end(write).await;
        }
        for (rv, kind, pod) in backlog {
            if selected(reqs, &pod) && !chunk(write, &json!({"type": kind, "object": pod})).await {
                return false;
            }
            last = last.max(rv);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval(BOOKMARK_EVERY);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return end(write).await,
                _ = tick.tick(), if bookmarks => {
                    let bm = json!({"type": "BOOKMARK", "object": {
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"resourceVersion": last.to_string()}}});
                    if !chunk(write, &bm).await {
                        return false;
                    }
                }
                ev = live.recv() => match ev {
                    Ok((_, "COMPACTED", _)) | Err(_) => return end(write).await,
                    Ok((rv, kind, pod)) => {
                        if rv <= last {
                            continue;
                        }
                        last = rv;
                        if selected(reqs, &pod)
                            && !chunk(write, &json!({"type": kind, "object": pod})).await
                        {
                            return false;
                        }
                    }
                },
            }
        }
    }
}

fn selected(reqs: &[selector::Requirement], pod: &Value) -> bool {
    let labels: BTreeMap<String, String> = pod["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    selector::matches(reqs, &labels)
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

async fn respond(write: &mut tokio::net::tcp::OwnedWriteHalf, code: u16, body: &Value) -> bool {
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    write.write_all(head.as_bytes()).await.is_ok() && write.write_all(body.as_bytes()).await.is_ok()
}

async fn chunk(write: &mut tokio::net::tcp::OwnedWriteHalf, v: &Value) -> bool {
    let line = format!("{v}\n");
    let framed = format!("{:x}\r\n{line}\r\n", line.len());
    write.write_all(framed.as_bytes()).await.is_ok() && write.flush().await.is_ok()
}

async fn end(write: &mut tokio::net::tcp::OwnedWriteHalf) -> bool {
    write.write_all(b"0\r\n\r\n").await.is_ok()
}

/// Percent-decoding of a query value (`+` is a space).
fn decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(c) => {
                        out.push(c);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A vLLM pod of the test pool: `ip` serves HTTP on `http`, events on
/// `kv`, replay on `replay`.
pub fn pod(name: &str, uid: &str, ip: &str, ready: bool, ports: (u16, u16, u16)) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "uid": uid, "labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": "vllm", "ports": [
            {"name": "http", "containerPort": ports.0},
            {"name": "kv-events", "containerPort": ports.1},
            {"name": "kv-replay", "containerPort": ports.2}
        ]}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [
            {"type": "Ready", "status": if ready { "True" } else { "False" }}
        ]}
    })
}
