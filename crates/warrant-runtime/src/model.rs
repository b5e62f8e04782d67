//! The chat model a workflow's `model` step asks for a proposal: an OpenAI-compatible
//! `/v1/chat/completions` endpoint the **operator** configures (base URL, model, credential),
//! reached through the SSRF-safe [`SafeClient`] like every other outbound connection.
//!
//! The proposed contract is offered as the one strict function tool, and the model is told to
//! call it. What comes back is untrusted: the `function.arguments` string is returned as bytes
//! for the strict parser and the pipeline's stages (`Envelope::for_arguments`,
//! `Authority::vet`), never interpreted here. A reply without exactly one call of that
//! function is a typed [`ModelError`].
//!
//! Hand-written rather than an OpenAI client crate: the request is one JSON document, and the
//! connection must go through [`SafeClient`] (its resolver pinning, address guard and response
//! cap), which no such crate lets us plug in.

use std::time::Duration;

use http::{HeaderValue, header};
use serde_json::{Value, json};
use url::Url;
use warrant_core::Contract;

use crate::net::{NetError, OutboundRequest, SafeClient};
use crate::secrets::Secret;

/// The operator's model endpoint.
#[derive(Clone)]
pub struct ModelEndpoint {
    /// The API base, e.g. `https://api.openai.com/v1` (`/chat/completions` is appended).
    pub base_url: Url,
    /// The model name sent with each request.
    pub model: String,
    /// The bearer token, if the endpoint wants one (from the operator's credentials).
    pub credential: Option<Secret>,
    /// The most tokens a completion may use.
    pub max_tokens: Option<u32>,
    /// How long one request may take.
    pub timeout: Duration,
}

impl std::fmt::Debug for ModelEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelEndpoint")
            .field("base_url", &self.base_url.as_str())
            .field("model", &self.model)
            .field("credential", &self.credential.as_ref().map(|_| "<redacted>"))
            .field("max_tokens", &self.max_tokens)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Tokens a completion used (the step's cost).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Completion tokens.
    pub completion: u64,
    /// Their total, as the endpoint reported it (or their sum).
    pub total: u64,
}

/// What the model proposed: the untrusted argument bytes and what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposed {
    /// `tool_calls[0].function.arguments`, exactly as received.
    pub arguments: Vec<u8>,
    /// Tokens used.
    pub usage: Usage,
}

/// Why the model gave no usable proposal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// No model endpoint is configured.
    #[error("no model endpoint is configured (`[model]` in warrant.toml)")]
    NotConfigured,
    /// The endpoint could not be reached, or did not answer in time (no side effect: a model
    /// call is tried again).
    #[error("the model endpoint is unreachable: {0}")]
    Unreachable(NetError),
    /// The endpoint answered with an error status.
    #[error("the model endpoint answered {status}: {snippet}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The start of the body.
        snippet: String,
    },
    /// The answer is not a chat completion.
    #[error("the model's answer is not a chat completion: {0}")]
    Malformed(String),
    /// The model called no function.
    #[error("the model proposed no call")]
    NoProposal,
    /// The model called the function more than once (one step proposes one call).
    #[error("the model proposed {0} calls; a model step takes exactly one")]
    ManyProposals(usize),
    /// The model called some other function.
    #[error("the model called `{0}`, not the proposed tool")]
    WrongTool(String),
}

impl ModelError {
    /// The stable code a step records.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::NotConfigured => "MODEL_NOT_CONFIGURED",
            ModelError::Unreachable(_) => "MODEL_UNREACHABLE",
            ModelError::Status { .. } => "MODEL_ERROR",
            ModelError::Malformed(_) => "MODEL_MALFORMED",
            ModelError::NoProposal => "MODEL_NO_PROPOSAL",
            ModelError::ManyProposals(_) => "MODEL_MANY_PROPOSALS",
            ModelError::WrongTool(_) => "MODEL_WRONG_TOOL",
        }
    }

    /// Whether asking again later may succeed (the endpoint was down, busy or failing).
    #[must_use]
    pub fn transient(&self) -> bool {
        match self {
            ModelError::Unreachable(_) => true,
            ModelError::Status { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

/// The instruction sent with every prompt.
const SYSTEM: &str = "You propose the arguments of exactly one call of the function you are given. \
Answer only with that function call. Your proposal is checked against the function's schema and \
the caller's policy, and may be reviewed by a person before it runs.";

/// A client of the operator's model endpoint.
#[derive(Clone)]
pub struct ModelClient {
    endpoint: ModelEndpoint,
    client: SafeClient,
}

impl std::fmt::Debug for ModelClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelClient")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// The function name a contract is offered under (`^[A-Za-z0-9_-]{1,64}$`, as the API wants).
#[must_use]
pub fn function_name(contract: &Contract) -> String {
    let name: String = contract
        .qualified_name()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        "propose".to_owned()
    } else {
        name
    }
}

impl ModelClient {
    /// A client of `endpoint` through `client` (whose policy must let it reach the endpoint).
    #[must_use]
    pub fn new(endpoint: ModelEndpoint, client: SafeClient) -> Self {
        Self { endpoint, client }
    }

    /// The endpoint.
    #[must_use]
    pub fn endpoint(&self) -> &ModelEndpoint {
        &self.endpoint
    }

    /// The completions URL.
    fn url(&self) -> Result<Url, ModelError> {
        let base = self.endpoint.base_url.as_str().trim_end_matches('/');
        Url::parse(&format!("{base}/chat/completions")).map_err(|e| ModelError::Malformed(e.to_string()))
    }

    /// The request body for a proposal of a call of `contract`.
    #[must_use]
    pub fn request_body(&self, contract: &Contract, prompt: &str) -> Value {
        let name = function_name(contract);
        let mut body = json!({
            "model": self.endpoint.model,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": prompt},
            ],
            "tools": [{
                "type": "function",
                "function": {
                    "name": name,
                    "description": contract.description(),
                    "parameters": contract.input_document().cloned().unwrap_or_else(|| json!({"type": "object"})),
                    "strict": true,
                },
            }],
            "tool_choice": {"type": "function", "function": {"name": name}},
            "parallel_tool_calls": false,
        });
        if let (Some(max), Some(map)) = (self.endpoint.max_tokens, body.as_object_mut()) {
            map.insert("max_tokens".into(), json!(max));
        }
        body
    }

    /// Asks the model to propose a call of `contract` for `prompt`.
    ///
    /// # Errors
    /// A [`ModelError`].
    pub async fn propose(&self, contract: &Contract, prompt: &str) -> Result<Proposed, ModelError> {
        let body = self.request_body(contract, prompt);
        let mut request = OutboundRequest::post(self.url()?, body.to_string());
        request
            .headers
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(secret) = &self.endpoint.credential {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", secret.expose()))
                .map_err(|_| ModelError::Malformed("the model credential is not a header value".into()))?;
            value.set_sensitive(true);
            request.headers.insert(header::AUTHORIZATION, value);
        }
        request.timeout = Some(self.endpoint.timeout);
        let response = self.client.send(request).await.map_err(ModelError::Unreachable)?;
        if !response.status.is_success() {
            let snippet: String = String::from_utf8_lossy(&response.body)
                .chars()
                .take(200)
                .collect();
            return Err(ModelError::Status {
                status: response.status.as_u16(),
                snippet,
            });
        }
        parse_completion(&response.body, &function_name(contract))
    }
}

/// The one proposal in a chat completion's body.
///
/// # Errors
/// A [`ModelError`] unless the first choice calls `function` exactly once with a string of
/// arguments.
pub fn parse_completion(body: &[u8], function: &str) -> Result<Proposed, ModelError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ModelError::Malformed(e.to_string()))?;
    let message = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .and_then(|c| c.get("message"))
        .ok_or_else(|| ModelError::Malformed("no `choices[0].message`".into()))?;
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => return Err(ModelError::NoProposal),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err(ModelError::Malformed("`tool_calls` is not an array".into())),
    };
    let call = match calls.as_slice() {
        [] => return Err(ModelError::NoProposal),
        [one] => one,
        many => return Err(ModelError::ManyProposals(many.len())),
    };
    let f = call
        .get("function")
        .ok_or_else(|| ModelError::Malformed("a tool call without `function`".into()))?;
    let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
    if name != function {
        return Err(ModelError::WrongTool(name.chars().take(64).collect()));
    }
    let arguments = f
        .get("arguments")
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError::Malformed("`function.arguments` is not a string".into()))?;
    let usage = value.get("usage");
    let count = |k: &str| usage.and_then(|u| u.get(k)).and_then(Value::as_u64).unwrap_or(0);
    let (prompt, completion) = (count("prompt_tokens"), count("completion_tokens"));
    let total = usage
        .and_then(|u| u.get("total_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(prompt.saturating_add(completion));
    Ok(Proposed {
        arguments: arguments.as_bytes().to_vec(),
        usage: Usage {
            prompt,
            completion,
            total,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(calls: Value) -> Vec<u8> {
        json!({
            "id": "c1", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": calls}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42},
        })
        .to_string()
        .into_bytes()
    }

    fn call(name: &str, arguments: &str) -> Value {
        json!({"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}})
    }

    #[test]
    fn one_call_of_the_function_is_a_proposal_with_its_bytes_untouched() {
        // Duplicate keys survive as bytes: the strict parser downstream refuses them.
        let raw = r#"{"amount_cents": 500, "amount_cents": 9}"#;
        let p = parse_completion(&completion(json!([call("credit", raw)])), "credit").unwrap();
        assert_eq!(p.arguments, raw.as_bytes());
        assert_eq!(
            p.usage,
            Usage {
                prompt: 30,
                completion: 12,
                total: 42
            }
        );
    }

    #[test]
    fn anything_but_one_call_of_the_function_is_refused() {
        let f = |body: Vec<u8>| parse_completion(&body, "credit").unwrap_err();
        assert_eq!(f(completion(json!([]))), ModelError::NoProposal);
        assert_eq!(f(completion(Value::Null)), ModelError::NoProposal);
        assert_eq!(
            f(completion(json!([call("credit", "{}"), call("credit", "{}")]))),
            ModelError::ManyProposals(2)
        );
        assert_eq!(
            f(completion(json!([call("other", "{}")]))),
            ModelError::WrongTool("other".into())
        );
        let object_args =
            json!([{"type": "function", "function": {"name": "credit", "arguments": {"a": 1}}}]);
        assert!(matches!(f(completion(object_args)), ModelError::Malformed(_)));
        assert!(matches!(f(b"not json".to_vec()), ModelError::Malformed(_)));
        assert!(matches!(
            f(b"{\"choices\": []}".to_vec()),
            ModelError::Malformed(_)
        ));
    }

    #[test]
    fn only_unreachable_or_busy_endpoints_are_asked_again() {
        assert!(ModelError::Unreachable(NetError::Timeout).transient());
        assert!(
            ModelError::Status {
                status: 503,
                snippet: String::new()
            }
            .transient()
        );
        assert!(
            ModelError::Status {
                status: 429,
                snippet: String::new()
            }
            .transient()
        );
        assert!(
            !ModelError::Status {
                status: 400,
                snippet: String::new()
            }
            .transient()
        );
        assert!(!ModelError::NoProposal.transient());
    }
}
