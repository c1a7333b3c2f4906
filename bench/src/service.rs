//! `k8s_service`: a Kubernetes Service as a benchmark client meets it.
//!
//! kube-proxy picks a backend pod at random per new TCP **connection**, not per
//! request. A benchmark client speaking HTTP/1.1 (vLLM's server does not speak
//! HTTP/2 in the clear) keeps a pool of keep-alive connections: a request takes
//! an idle connection if there is one, else opens a new one, which lands on a
//! random pod. The requests therefore follow the connections, and the pods
//! share the load in proportion to how many connections they drew, for as long
//! as those connections live.
//!
//! The client modelled here is httpx's default pool (the client of Python
//! benchmark tools such as GuideLLM), described from httpcore's public docs and
//! behaviour:
//! - the first idle connection in creation order is reused;
//! - a new connection is opened when none is idle (httpx allows 100; no limit
//!   here, so no request waits on the client side);
//! - an idle connection is closed after 5 s (httpx's `keepalive_expiry`, also
//!   uvicorn's `timeout_keep_alive`, vLLM's server).
//!
//! One client process with one pool: a tool that spreads its load over several
//! processes holds several pools, which spreads it further.

/// httpx `keepalive_expiry` and uvicorn `timeout_keep_alive` (seconds).
pub const KEEPALIVE_S: f64 = 5.0;

#[derive(Debug, Clone, Copy)]
struct Connection {
    worker: usize,
    /// The request on it, or `None` while idle.
    busy: Option<u64>,
    /// When it last became idle (or was opened).
    idle_since: f64,
}

/// The client's connection pool through a Service of `workers` pods.
#[derive(Debug)]
pub struct ServicePool {
    workers: usize,
    /// In creation order.
    connections: Vec<Connection>,
}

// === impl ServicePool ===

impl ServicePool {
    pub fn new(workers: usize) -> Self {
        Self {
            workers: workers.max(1),
            connections: Vec::new(),
        }
    }

    /// The pod request `id` goes to at `now`; `draw` is the random number
    /// kube-proxy would use if a new connection is needed.
    pub fn pick(&mut self, id: u64, now: f64, draw: u64) -> usize {
        self.connections
            .retain(|c| c.busy.is_some() || now - c.idle_since <= KEEPALIVE_S);
        let slot = match self.connections.iter().position(|c| c.busy.is_none()) {
            Some(i) => i,
            None => {
                self.connections.push(Connection {
                    worker: (draw % self.workers as u64) as usize,
                    busy: None,
                    idle_since: now,
                });
                self.connections.len() - 1
            }
        };
        let c = &mut self.connections[slot];
        c.busy = Some(id);
        c.worker
    }

    /// Request `id`'s response ended at `now`: its connection is idle again
    /// (nothing happens for a request the pool did not place).
    pub fn done(&mut self, id: u64, now: f64) {
        if let Some(c) = self.connections.iter_mut().find(|c| c.busy == Some(id)) {
            c.busy = None;
            c.idle_since = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pods of the open connections, in creation order.
    fn pods(pool: &ServicePool) -> Vec<usize> {
        pool.connections.iter().map(|c| c.worker).collect()
    }

    #[test]
    fn an_idle_connection_is_reused_oldest_first() {
        let mut pool = ServicePool::new(6);
        // Two requests at once: two connections, two draws.
        assert_eq!(pool.pick(1, 0.0, 2), 2);
        assert_eq!(pool.pick(2, 0.1, 4), 4);
        // Both idle again: the next request takes the older one, whatever the draw.
        pool.done(2, 1.0);
        pool.done(1, 2.0);
        assert_eq!(pool.pick(3, 2.5, 5), 2);
        // The older one is busy: the newer idle one, no new connection.
        assert_eq!(pool.pick(4, 2.6, 5), 4);
        assert_eq!(pods(&pool), vec![2, 4]);
        // All busy: a new connection, on the drawn pod.
        assert_eq!(pool.pick(5, 2.7, 13), 1);
        assert_eq!(pods(&pool), vec![2, 4, 1]);
    }

    #[test]
    fn an_idle_connection_closes_after_the_keepalive() {
        let mut pool = ServicePool::new(6);
        assert_eq!(pool.pick(1, 0.0, 3), 3);
        pool.done(1, 10.0);
        // Within the keep-alive: reused.
        assert_eq!(pool.pick(2, 10.0 + KEEPALIVE_S, 0), 3);
        pool.done(2, 20.0);
        // Past it: closed, a new draw decides.
        assert_eq!(pool.pick(3, 20.0 + KEEPALIVE_S + 0.1, 0), 0);
        assert_eq!(pods(&pool), vec![0]);
    }

    #[test]
    fn a_busy_connection_never_expires_and_unknown_ends_are_ignored() {
        let mut pool = ServicePool::new(2);
        assert_eq!(pool.pick(1, 0.0, 1), 1);
        // A long response: its connection stays however long it takes.
        assert_eq!(pool.pick(2, 100.0, 0), 0);
        pool.done(99, 100.0);
        pool.done(1, 101.0);
        assert_eq!(pool.pick(3, 102.0, 0), 1);
        assert_eq!(pods(&pool), vec![1, 0]);
    }
}
