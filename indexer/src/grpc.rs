//! The tonic `Router` service: proto in, [`Picker`] calls, proto out.

use crate::{
    picker::{Mode, Outcome, PickInput, Picker},
    prompt,
    report::ReportKind,
};
use kvsteer_proto::v1::{
    self as pb,
    router_server::{Router, RouterServer},
};
use std::{sync::Arc, time::Instant};
use tonic::{Request, Response, Status};

#[derive(Clone)]
pub struct RouterService {
    picker: Arc<Picker>,
}

// === impl RouterService ===

impl RouterService {
    pub fn new(picker: Arc<Picker>) -> Self {
        Self { picker }
    }

    pub fn into_server(self) -> RouterServer<Self> {
        RouterServer::new(self)
    }
}

pub fn pick_input(req: &pb::PickRequest) -> PickInput {
    PickInput {
        request_id: req.request_id.clone(),
        tenant: req.tenant.clone(),
        model: req.model.clone(),
        prompt: prompt::from_proto(req).map_err(|e| e.to_string()),
        cache_salt: (!req.cache_salt.is_empty()).then(|| req.cache_salt.clone()),
    }
}

pub fn pick_response(out: Outcome) -> pb::PickResponse {
    let d = out.decision;
    pb::PickResponse {
        endpoints: out.endpoints,
        decision: Some(pb::Decision {
            policy: d.policy.to_owned(),
            worker: d.worker,
            prompt_tokens: d.prompt_tokens,
            matched_tokens: d.matched_tokens,
            predicted_ttft_ms: d.predicted_ttft_ms,
            degraded: d.degraded,
            reason: d.reason,
        }),
        replacement_body: None,
        rejection: None,
    }
}

#[tonic::async_trait]
impl Router for RouterService {
    async fn pick(
        &self,
        request: Request<pb::PickRequest>,
    ) -> Result<Response<pb::PickResponse>, Status> {
        let req = request.into_inner();
        let out = self.picker.pick(pick_input(&req), Mode::Commit).await;
        tracing::debug!(
            request_id = %req.request_id,
            model = %req.model,
            worker = %out.decision.worker,
            prompt_tokens = out.decision.prompt_tokens,
            matched_tokens = out.decision.matched_tokens,
            predicted_ttft_ms = out.decision.predicted_ttft_ms,
            degraded = out.decision.degraded,
            "pick"
        );
        Ok(Response::new(pick_response(out)))
    }

    async fn report(
        &self,
        request: Request<pb::ReportRequest>,
    ) -> Result<Response<pb::ReportResponse>, Status> {
        let r = request.into_inner();
        let kind = match pb::ReportKind::try_from(r.kind) {
            Ok(pb::ReportKind::FirstToken) => ReportKind::FirstToken,
            Ok(pb::ReportKind::Done) => ReportKind::Done,
            Ok(pb::ReportKind::Cancelled) => ReportKind::Cancelled,
            _ => {
                return Err(Status::invalid_argument(format!(
                    "kind: unsupported report kind {}",
                    r.kind
                )));
            }
        };
        self.picker
            .report(&r.request_id, kind, r.elapsed_ms, Instant::now());
        Ok(Response::new(pb::ReportResponse {}))
    }
}
