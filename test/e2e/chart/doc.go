// Package chart checks the Helm chart (charts/converge) without a cluster:
// the SDK's linter passes it, its schema refuses wrong values, and it
// installs the same objects as deploy/'s kustomization, in every
// combination of the choices both offer. The e2e suite installs it for
// real (../helm_test.go).
package chart
