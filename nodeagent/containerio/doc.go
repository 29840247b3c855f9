// Package containerio owns a container's standard streams on the node: a small process per container (like
// CRI-O's conmon) that holds the FIFOs containerd's shim writes to, writes the output to the container's log
// file in the CRI format the kubelet uses, rotates that file by size, and keeps the container's stdin open for
// attach. Because the process runs in its own session, logs keep flowing and stdin stays open while the agent
// restarts or is killed.
//
// The agent calls Start before creating a task and passes the returned cio.Creator to NewTask. The stdio process
// is cmd/skiff-container-io, installed beside skiff, whose main is RunChildIfAsked; without it the running
// binary becomes the stdio process the same way (RunChildIfAsked finds SKIFF_CONTAINER_IO in its environment).
// The package links nothing of the CRI API, to keep that program small; package containerlogs reads the files
// back for `kubectl logs`.
//
// Everything about one container lives in the directory given to Start: the FIFOs, spec.json, the process's
// pid and its own error log (io.log). The package does not talk to containerd and does not decide where logs
// go or how big they may get: the caller's Spec says so.
package containerio
