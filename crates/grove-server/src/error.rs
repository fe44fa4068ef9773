//! The one error type of the HTTP edge and its one mapping to HTTP: every failure a client can
//! see becomes an OpenAI-style body `{"error": {"message", "type", "param", "code"}}` with the
//! status OpenAI uses for it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use grove_core::{Naming, ValidationError};
use grove_engine::EngineError;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// Bad input: names the field (`param`) and the limit in the message.
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
        code: Option<&'static str>,
    },
    #[error("invalid or missing API key: send `Authorization: Bearer <key>` with the key the server was started with (--api-key)")]
    Unauthorized,
    #[error(
        "the model `{requested}` does not exist; this server serves `{served}` (GET /v1/models)"
    )]
    ModelNotFound { requested: String, served: String },
    #[error("the request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// A body cut short or sent in broken chunks: the client's fault, but not its size.
    #[error("the request body could not be read: {reason}")]
    BodyUnreadable { reason: String },
    #[error("no route for {method} {path}")]
    RouteNotFound { method: String, path: String },
    #[error("the server is shutting down and takes no new requests; retry on another replica")]
    ShuttingDown,
    #[error("`{method}` is not allowed on {path}; see the response's Allow header")]
    MethodNotAllowed { method: String, path: String },
    #[error(
        "the server's queue is full ({limit} waiting requests, --max-queued-requests); retry later"
    )]
    QueueFull { limit: usize },
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::ModelNotFound { .. } | Self::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyUnreadable { .. } => StatusCode::BAD_REQUEST,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidRequest { .. }
            | Self::BodyTooLarge { .. }
            | Self::BodyUnreadable { .. }
            | Self::Unauthorized
            | Self::ModelNotFound { .. }
            | Self::RouteNotFound { .. }
            | Self::MethodNotAllowed { .. } => "invalid_request_error",
            Self::QueueFull { .. } => "rate_limit_error",
            Self::Internal(_) | Self::ShuttingDown => "server_error",
        }
    }

    pub fn param(&self) -> Option<&str> {
        match self {
            Self::InvalidRequest { param, .. } => param.as_deref(),
            Self::ModelNotFound { .. } => Some("model"),
            Self::BodyTooLarge { .. } | Self::BodyUnreadable { .. } => Some("body"),
            _ => None,
        }
    }

    pub fn code(&self) -> Option<&'static str> {
        match self {
            Self::InvalidRequest { code, .. } => *code,
            Self::Unauthorized => Some("invalid_api_key"),
            Self::ModelNotFound { .. } => Some("model_not_found"),
            Self::RouteNotFound { .. } => Some("not_found"),
            Self::MethodNotAllowed { .. } => Some("method_not_allowed"),
            Self::ShuttingDown => Some("server_shutting_down"),
            Self::QueueFull { .. } => Some("queue_full"),
            Self::BodyTooLarge { .. } => Some("body_too_large"),
            Self::BodyUnreadable { .. } => Some("invalid_body"),
            Self::Internal(_) => None,
        }
    }

    /// The JSON body, also sent as the last SSE event of a stream that fails midway.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": bounded(self.to_string(), MAX_MESSAGE_BYTES),
                "type": self.kind(),
                "param": self.param(),
                "code": self.code(),
            }
        })
    }

    /// Short label for the `grove_requests_total{outcome}` metric.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::QueueFull { .. } | Self::ShuttingDown => "rejected",
            Self::Internal(_) => "error",
            _ => "invalid",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(self.body())).into_response();
        if matches!(self, Self::QueueFull { .. }) {
            // Clients that back off (the openai package does) read how long to wait.
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

/// Seconds a refused client is asked to wait (`Retry-After`): about one decode step's worth
/// of a queue draining on a CPU.
const RETRY_AFTER_SECONDS: &str = "1";

/// The longest error message sent: messages quote what the client sent (a model name, a
/// value out of range, serde's quote of a wrong value), and a 3 MB name must not come back
/// as a 3 MB error.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024;

/// `text` cut to at most `max` bytes at a character boundary, saying how much was left out.
pub(crate) fn bounded(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} more bytes)", &text[..end], text.len() - end)
}

impl From<ValidationError> for ApiError {
    /// The refusal in OpenAI's names (`max_tokens`, not the engine's `max_new_tokens`).
    fn from(error: ValidationError) -> Self {
        Self::InvalidRequest {
            message: error.message(Naming::OpenAi),
            param: Some(error.field(Naming::OpenAi).into_owned()),
            code: error.code(),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::Validation(error) => error.into(),
            other => Self::Internal(other.to_string()),
        }
    }
}
