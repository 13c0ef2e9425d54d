//! ValidatingAdmissionPolicy evaluation.
