// Package privilege holds the documented privilege of converge's service
// accounts as one table of questions to the API server (Table): who may do
// what to which object, and whether the answer is yes. SECURITY.md shows
// the same table ("Privileges of the service accounts"); this package's
// test reads it from there and fails when the two differ, so the document
// cannot drift from what is checked. The e2e suite (../privilege_test.go)
// asks the cluster's API server each question as a SubjectAccessReview of
// the service account, against the RBAC deploy/ installs.
package privilege
