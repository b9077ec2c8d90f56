"""What a user configures and what is derived from it before anything is claimed: the options
and their validation, route rules and scopes, the key header's parsing and the storage key,
request and payload fingerprints, the read-only request view."""
