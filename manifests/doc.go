// Package manifests applies the auto-applied manifests folder, as k3s's deploy controller does: while this
// server is the Raft leader, every YAML or JSON file in the folder is applied with server-side apply under
// the field manager skiff-manifests, again whenever it changes, and what a file no longer holds (or a removed
// file held) is deleted.
//
// What each file applied is recorded in the cluster, in a ConfigMap per file in kube-system, so that a new
// leader, which reads its own copy of the folder, knows what the files it lacks had created. The package
// reaches the cluster only through client-go; it holds no state across leadership terms.
package manifests
