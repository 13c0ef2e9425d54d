//! RBAC authorization.
