//! The client's credentials and TLS for a scenario run against a broker
//! with authentication or TLS on (`--addr`), the same options as the
//! `spool` CLI's, so the cost of both can be measured beside a run without.

use std::path::PathBuf;

use spool_client::{ClientConfig, ClientError, Credentials};

/// `--principal`/`--secret` and the `--tls-*` options (each also from the
/// CLI's `SPOOL_*` variable).
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct ClientSecurity {
    /// Principal to authenticate as. Env: SPOOL_PRINCIPAL.
    #[arg(long, value_name = "NAME")]
    pub principal: Option<String>,
    /// Its secret. Env: SPOOL_SECRET (preferred: a flag shows in `ps`).
    #[arg(long, value_name = "SECRET")]
    pub secret: Option<String>,
    /// Speak TLS, trusting the CA certificates of this PEM file.
    /// Env: SPOOL_TLS_CA.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Name to check the broker's certificate against. Env: SPOOL_TLS_SERVER_NAME.
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// Client certificate (PEM). Env: SPOOL_TLS_CERT.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM). Env: SPOOL_TLS_KEY.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

impl ClientSecurity {
    /// The flags, each unset one taken from its environment variable.
    #[must_use]
    pub fn with_env(self) -> ClientSecurity {
        ClientSecurity {
            principal: self.principal.or_else(|| env("SPOOL_PRINCIPAL")),
            secret: self.secret.or_else(|| env("SPOOL_SECRET")),
            tls_ca: self.tls_ca.or_else(|| env("SPOOL_TLS_CA").map(PathBuf::from)),
            tls_server_name: self.tls_server_name.or_else(|| env("SPOOL_TLS_SERVER_NAME")),
            tls_cert: self.tls_cert.or_else(|| env("SPOOL_TLS_CERT").map(PathBuf::from)),
            tls_key: self.tls_key.or_else(|| env("SPOOL_TLS_KEY").map(PathBuf::from)),
        }
    }

    /// Whether connections speak TLS.
    pub fn tls(&self) -> bool {
        self.tls_ca.is_some()
    }

    /// Whether connections authenticate with a secret.
    pub fn authenticates(&self) -> bool {
        self.principal.is_some()
    }

    /// `base` with these credentials and TLS.
    ///
    /// # Errors
    /// [`ClientError::Config`]: a principal without a secret, or TLS
    /// options that cannot be used (see `spool_client::tls::from_options`).
    pub fn apply(&self, base: ClientConfig) -> Result<ClientConfig, ClientError> {
        let mut config = base;
        if let Some(principal) = &self.principal {
            let Some(secret) = &self.secret else {
                return Err(ClientError::Config(format!(
                    "principal {principal} given without a secret (--secret or SPOOL_SECRET)"
                )));
            };
            config = config.with_credentials(Credentials::new(principal.clone(), secret.clone()));
        }
        config.connection.tls = spool_client::tls::from_options(
            self.tls_ca.as_deref(),
            self.tls_server_name.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
        )?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: no options leave the config as it was; a principal needs its
    // secret; TLS options need the CA. Method: apply a few sets.
    #[test]
    fn options_apply_or_name_what_is_missing() {
        let plain = ClientSecurity::default().apply(ClientConfig::default()).unwrap();
        assert!(plain.connection.tls.is_none() && plain.connection.credentials.is_none());
        let secured = ClientSecurity {
            principal: Some("bench".to_owned()),
            secret: Some("s".to_owned()),
            ..ClientSecurity::default()
        }
        .apply(ClientConfig::default())
        .unwrap();
        assert_eq!(secured.connection.credentials.unwrap().principal, "bench");
        let lonely = ClientSecurity { principal: Some("bench".to_owned()), ..Default::default() };
        assert!(lonely.apply(ClientConfig::default()).unwrap_err().to_string().contains("secret"));
        let no_ca = ClientSecurity { tls_server_name: Some("x".to_owned()), ..Default::default() };
        assert!(no_ca.apply(ClientConfig::default()).unwrap_err().to_string().contains("--tls-ca"));
    }
}
