//! OAuth records as the relay stores them (`crosstalk serve --oauth`): what each secret —
//! an invite code, an authorization code, an access or refresh token — stands for, kept under
//! the SHA-256 of the secret, never the secret itself. Times are seconds since the epoch.

use serde::{Deserialize, Serialize};

/// A single-use invite an admin minted: whoever types it in consents for the connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invite {
    pub id: String,
    /// Tokens from it act only as this identity (`--as`); `None`: as anyone, but never as
    /// the admin.
    pub identity: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
    pub note: Option<String>,
}

/// A client that registered itself (RFC 7591).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OAuthClient {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    pub created_at: i64,
}

/// An authorization code not yet exchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthCode {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uri: String,
    /// The PKCE S256 challenge.
    pub challenge: String,
    pub resource: String,
    pub scope: String,
    pub identity: Option<String>,
    pub invite_id: String,
    pub expires_at: i64,
}

/// One consent: what `crosstalk clients` lists and revokes, with its current tokens' hashes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub id: String,
    pub client_id: String,
    pub client_name: String,
    /// Where the consent page sent the code (the host of the redirect URI).
    pub redirect_host: String,
    pub identity: Option<String>,
    pub invite_id: String,
    pub scope: String,
    pub resource: String,
    pub created_at: i64,
    /// The current access token's hash.
    pub access: String,
    /// The current refresh token's hash.
    pub refresh: String,
    /// Refresh tokens this grant rotated away from, and the authorization code it was made
    /// from: one of them coming back is a stolen secret being replayed, and ends the grant.
    pub retired: Vec<String>,
}

/// What a token's hash points at. A token is good only while its grant names it as current
/// ([`Grant::access`], [`Grant::refresh`]): the grant is the one record a refresh and a
/// revocation change, by compare-and-set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenKind {
    Access,
    Refresh,
    /// A refresh token already used once (written by releases before the grant was the
    /// judge; a refresh token its grant no longer names reads the same).
    Retired,
    /// An authorization code that was exchanged for this grant: it coming back ends the grant
    /// (RFC 6749 §4.1.2). Added last, so every earlier record reads as it did.
    Code,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRef {
    pub grant: String,
    pub kind: TokenKind,
    pub expires_at: i64,
}

crate::stored!(
    Invite => "OAuth invite",
    OAuthClient => "OAuth client",
    AuthCode => "OAuth code",
    Grant => "OAuth grant",
    TokenRef => "OAuth token",
);

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A token record as the store holds it, for every kind: `Code` was added last, so the
    /// records of the kinds before it keep their bytes (a `Retired` one written by the
    /// release before `Code` reads as it did), and a `Code` one reads back as itself.
    #[test]
    fn token_records_keep_their_bytes() {
        let record = |kind| TokenRef {
            grant: "g1".into(),
            kind,
            expires_at: 1_700_000_000,
        };
        for (kind, golden) in [
            (TokenKind::Access, "011370ba570267310080c49fd50c"),
            (TokenKind::Refresh, "01b6a3e69c0267310180c49fd50c"),
            (TokenKind::Retired, "0118d1721a0267310280c49fd50c"),
            (TokenKind::Code, "01bd022ed10267310380c49fd50c"),
        ] {
            let bytes = crate::encode(&record(kind));
            assert_eq!(hex(&bytes), golden, "{kind:?}");
            assert_eq!(crate::decode::<TokenRef>(&bytes).unwrap(), record(kind));
        }
    }
}
