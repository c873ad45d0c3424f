// Package manifests generates deploy/ from the Helm chart, charts/converge,
// which is the one source of what converge installs: the chart has the
// values and the choices, and a kustomization cannot be turned into a chart
// with values, while a chart rendered with deploy/'s choices is a
// kustomization's resources.
//
// Generate renders the chart through the Helm SDK as helm install does
// (release converge in kube-system), once with every choice deploy/ offers
// as a component off (the base) and once with each turned on. Each
// template's output becomes one file, Helm's bookkeeping (its labels and
// annotations) taken out as text so that the templates' comments stay;
// what a component adds becomes that component's resources, and what it
// changes in an object of the base a strategic-merge patch. The
// kustomization.yaml files stay hand-written glue: they may hold nothing
// else (no labels:, no inline patch: checkKustomization decodes them
// strictly), and must list exactly the files generated beside them. Then
// kustomize builds deploy/, those kustomizations over the generated files,
// with every combination of the components, and each build must be the
// chart rendered with those components on (checkBuilds): two components
// that patch the same list, or an object the chart renders only with two
// of them on, fail it. make manifests writes the files
// (cmd/converge-manifests), and test/e2e/chart fails while deploy/ is not
// what Generate makes.
package manifests
