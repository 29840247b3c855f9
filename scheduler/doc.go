// Package scheduler places pods on nodes. It runs only on the Raft leader, as a leader service.
//
// The pipeline for one pod (scheduleOne):
//  1. pop the highest-priority pod from the queue (priority, then creation time);
//  2. run every PreFilter plugin once for the pod (they precompute per-pod state);
//  3. run the Filter plugins on the nodes, recording why each rejected node was rejected;
//  4. run the Score plugins on the feasible nodes, normalize each to 0-100 and sum them with their weights;
//  5. pick the best node, breaking ties at random with a seedable source;
//  6. assume the pod on that node in the cache, so that the next decision already sees it;
//  7. bind through the API's binding subresource, concurrently with the next decisions; a failed bind
//     forgets the assumption and requeues the pod.
//
// A pod that fits nowhere gets a FailedScheduling event and a PodScheduled=False condition with the
// aggregate of the rejections, may preempt lower-priority pods, and is parked until a cluster event that
// could help it (or at most five minutes).
//
// The cache indexes pods by label, so that the affinity and spread pre-filters count only the pods their
// selectors can match rather than every pod in the cluster.
//
// The scheduler reads nodes and pods from client-go informers and writes only through the API, so that
// admission and validation apply to it as to any client.
package scheduler
