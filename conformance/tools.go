//go:build tools

// Package conformance pins, in go.mod, the programs `make conformance` builds from the k8s.io/kubernetes
// v1.37.2 module graph: the e2e suite, its ginkgo runner, kubectl, and the agnhost and sample-apiserver
// images' programs. Skiff itself imports none of them.
package conformance

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/sample-apiserver"
)
