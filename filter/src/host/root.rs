//! The root context: parses the plugin configuration once and hands it, with
//! the metric ids, to every HTTP context.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};

use crate::config::FilterConfig;
use crate::host::calls::Metrics;
use crate::host::http::KvsteerHttp;

/// What every HTTP context of one plugin configuration shares.
pub(crate) struct Shared {
    pub(crate) config: FilterConfig,
    pub(crate) metrics: Metrics,
}

#[derive(Default)]
pub(crate) struct KvsteerRoot {
    shared: Option<Rc<Shared>>,
}

impl Context for KvsteerRoot {}

impl RootContext for KvsteerRoot {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        // Follow Envoy's level for the wasm logger (`--component-log-level wasm:debug`).
        if let Ok(level) = hostcalls::get_log_level() {
            proxy_wasm::set_log_level(level);
        }
        let bytes = match hostcalls::get_buffer(
            BufferType::PluginConfiguration,
            0,
            plugin_configuration_size,
        ) {
            Ok(bytes) => bytes.unwrap_or_default(),
            Err(status) => {
                log::error!("kvsteer-filter: cannot read the plugin configuration: {status:?}");
                return false;
            }
        };
        match FilterConfig::from_json(&bytes) {
            Ok(config) => {
                log::info!(
                    "kvsteer-filter: configured: indexer cluster {}, timeout {} ms, paths {:?}",
                    config.indexer_cluster,
                    config.timeout_ms,
                    config.paths
                );
                self.shared = Some(Rc::new(Shared {
                    config,
                    metrics: Metrics::define(),
                }));
                true
            }
            Err(error) => {
                log::error!("kvsteer-filter: rejecting configuration: {error}");
                false
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Always a context (the SDK panics on None); without a configuration it
        // lets everything through.
        Some(Box::new(KvsteerHttp::new(context_id, self.shared.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
