// Package chart checks the Helm chart (charts/converge) without a cluster:
// the SDK's linter passes it, its schema refuses wrong values, and deploy/
// is what make manifests generates from it (package manifests), so that
// kubectl apply -k deploy/ installs what helm install does. The e2e suite
// installs it for real (../helm_test.go).
package chart
