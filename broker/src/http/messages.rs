//! The conversation and message routes: list and add conversations, read and post
//! messages.

use axum::extract::{Path, Query, State};
use axum::Extension;
use axum::Json;
use relay_protocol::api::MessagePosted;
use relay_protocol::domain::Conversation;
use relay_protocol::methods::call as m;

use super::{ApiJson, ApiResult, ApiState, Login, Principal, Req};
use crate::error::BrokerError;

/// An agent's token lists the conversations it may read (see `reads`).
pub(super) async fn list_conversations(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
) -> ApiResult<Vec<Conversation>> {
    let mut all: Vec<Conversation> = s
        .broker
        .store()
        .read_listing(|st| st.conversations())
        .await?;
    if let Some(me) = principal.agent() {
        all.retain(|c| super::reads::in_conversation(c, me));
    }
    Ok(Json(all))
}

pub(super) async fn add_conversation(
    State(s): State<ApiState>,
    ApiJson(spec): ApiJson<Req<m::ConversationAdd>>,
) -> ApiResult<Conversation> {
    Ok(Json(s.broker.create_conversation(spec).await?))
}

pub(super) async fn read_messages(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Query(q): Query<Req<m::ConversationRead>>,
) -> ApiResult<Vec<relay_protocol::domain::Message>> {
    principal.may_read_conversation(&s.broker, &id).await?;
    let limit = q.limit.unwrap_or(50);
    let messages = s
        .broker
        .store()
        .read(move |store| {
            if store.conversation(&id)?.is_none() {
                return Err(BrokerError::UnknownConversation(id.clone()));
            }
            store.messages(&id, limit)
        })
        .await?;
    Ok(Json(messages))
}

/// An agent's token posts as that agent; its message is marked with the flight the agent
/// is running (so what it mentions is asked within that flight's chain). A dashboard
/// login posts as `NAME@dashboard`, whatever the body says.
pub(super) async fn post_message(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    ApiJson(mut post): ApiJson<Req<m::MessagePost>>,
) -> ApiResult<MessagePosted> {
    if let Some(Extension(web)) = login {
        post.author = web.decided_by();
    }
    principal.act_as(&post.author)?;
    let given = post.meta.flight.take();
    let posted = principal
        .with_parent(&s.broker, given, |flight| {
            let mut post = post.clone();
            post.meta.flight = flight;
            s.broker.post_message(post)
        })
        .await?;
    Ok(Json(posted))
}
