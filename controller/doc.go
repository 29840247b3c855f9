// Package controller is Skiff's controller manager. Its controllers run only on the Raft leader, reach the
// API through client-go (the leader's own peer), and reconcile with informers and work queues, one file per
// controller. It never touches the store directly.
package controller
