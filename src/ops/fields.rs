//! Reading a request's JSON object in one pass, straight from the client's bytes (or from MCP
//! arguments), with some of its fields decided elsewhere: [`WithParams`] puts a route's path
//! parameters in and drops the body's fields of the same names (the path decides), and
//! [`Without`] takes one field out for its reader to handle apart. Neither builds a
//! `serde_json::Value` of the whole request: a post used to be parsed three times over
//! (bytes into a `Value`, a `Value` into a map, the map into the message).

use serde::de::value::{BorrowedStrDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};
use std::fmt;

/// A field's name as the input holds it: borrowed from the client's bytes where it can be.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

/// The next field of `inner` that `taken` does not take, its name handed to `seed` as the map
/// itself would have; `taken` reads the value of each field it takes.
fn next_kept<'de, M, K>(
    inner: &mut M,
    seed: K,
    mut taken: impl FnMut(&str, &mut M) -> Result<bool, M::Error>,
) -> Result<Option<K::Value>, M::Error>
where
    M: MapAccess<'de>,
    K: DeserializeSeed<'de>,
{
    loop {
        let Some(key) = inner.next_key::<Key<'de>>()? else {
            return Ok(None);
        };
        if taken(key.as_str(), inner)? {
            continue;
        }
        return match key {
            Key::Borrowed(s) => seed.deserialize(BorrowedStrDeserializer::new(s)),
            Key::Owned(s) => seed.deserialize(StringDeserializer::new(s)),
        }
        .map(Some);
    }
}

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// A JSON object's fields with `params` put in first and the object's own fields of those
/// names dropped (their values are skipped, unread): a route's path parameters, which decide
/// over the body. Deserialize a request from it as from the object itself.
pub struct WithParams<'p, D> {
    pub inner: D,
    pub params: &'p [(&'p str, String)],
}

impl<'de, 'p, D: Deserializer<'de>> Deserializer<'de> for WithParams<'p, D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_map(ParamsVisitor {
            visitor,
            params: self.params,
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

struct ParamsVisitor<'p, V> {
    visitor: V,
    params: &'p [(&'p str, String)],
}

impl<'de, 'p, V: Visitor<'de>> Visitor<'de> for ParamsVisitor<'p, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<V::Value, M::Error> {
        self.visitor.visit_map(ParamsMap {
            inner: map,
            params: self.params,
            next: 0,
            value: None,
        })
    }
}

struct ParamsMap<'p, M> {
    inner: M,
    params: &'p [(&'p str, String)],
    /// The next parameter to hand out.
    next: usize,
    /// The value of the parameter whose name was just handed out.
    value: Option<&'p str>,
}

impl<'de, 'p, M: MapAccess<'de>> MapAccess<'de> for ParamsMap<'p, M> {
    type Error = M::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, M::Error> {
        if let Some((name, value)) = self.params.get(self.next) {
            self.next += 1;
            self.value = Some(value);
            return seed.deserialize(name.into_deserializer()).map(Some);
        }
        let params = self.params;
        next_kept(&mut self.inner, seed, |key, inner| {
            let param = params.iter().any(|(name, _)| *name == key);
            if param {
                inner.next_value::<de::IgnoredAny>()?;
            }
            Ok(param)
        })
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, M::Error> {
        match self.value.take() {
            Some(value) => seed.deserialize(value.into_deserializer()),
            None => self.inner.next_value_seed(seed),
        }
    }
}

/// A JSON object's fields but `name`'s, whose value is kept in `taken` for its reader to
/// handle apart. Deserialize the rest from it as from the object itself.
pub struct Without<'t, M> {
    pub inner: M,
    pub name: &'static str,
    pub taken: &'t mut Option<serde_json::Value>,
}

impl<'de, M: MapAccess<'de>> MapAccess<'de> for Without<'_, M> {
    type Error = M::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, M::Error> {
        let (name, taken) = (self.name, &mut *self.taken);
        next_kept(&mut self.inner, seed, |key, inner| {
            if key != name {
                return Ok(false);
            }
            *taken = Some(inner.next_value()?);
            Ok(true)
        })
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, M::Error> {
        self.inner.next_value_seed(seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Renew {
        id: String,
        #[serde(default)]
        ttl_s: Option<u64>,
    }

    fn read<T: de::DeserializeOwned>(body: &str, params: &[(&str, String)]) -> Result<T, String> {
        let mut de = serde_json::Deserializer::from_slice(body.as_bytes());
        serde_path_to_error::deserialize(WithParams { inner: &mut de, params }).map_err(|e| {
            let path = e.path().to_string();
            format!("{path}: {}", e.into_inner())
        })
    }

    #[test]
    fn path_parameters_decide_over_the_body() {
        let id = [("id", "r-1".to_owned())];
        assert_eq!(
            read::<Renew>(r#"{"ttl_s": 5}"#, &id),
            Ok(Renew {
                id: "r-1".into(),
                ttl_s: Some(5)
            })
        );
        // The body's own `id` is skipped unread, whatever it holds.
        assert_eq!(
            read::<Renew>(r#"{"id": {"deep": [1, 2]}, "ttl_s": 5}"#, &id),
            Ok(Renew {
                id: "r-1".into(),
                ttl_s: Some(5)
            })
        );
        // Without the parameter, the body's field is the field.
        assert_eq!(
            read::<Renew>(r#"{"id": "mine"}"#, &[]),
            Ok(Renew {
                id: "mine".into(),
                ttl_s: None
            })
        );
        // An error in a field names it; an escaped name is still that name.
        let err = read::<Renew>(r#"{"ttl\u005fs": "soon"}"#, &id).unwrap_err();
        assert!(err.starts_with("ttl_s: invalid type: string \"soon\""), "{err}");
    }
}
