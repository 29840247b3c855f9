// Package nodeagent is Skiff's kubelet: `skiff agent` registers its Node (or, with the simulated runtime,
// many Nodes), watches through the API the pods bound to it, makes them real with a runtime, keeps them as
// their specs say, and reports their status.
//
// It joins with the cluster join token (package internal/join): it checks the cluster CA against the token,
// then authenticates as system:node:<name>. It talks to the servers only through the Kubernetes API.
package nodeagent
