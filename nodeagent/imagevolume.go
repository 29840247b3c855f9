package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/snapshots"
	"github.com/opencontainers/image-spec/identity"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Image volumes (KEP-4639): a volume whose content is an OCI image's filesystem, mounted read-only in the
// pod's containers. The agent pulls the image by the volume's pullPolicy, as it pulls a container's, and
// mounts a read-only view of its unpacked layers (a containerd snapshot named after the pod and the volume)
// under the pod's volumes directory; containers bind-mount it from there, read-only whatever their
// volumeMount says. teardownVolumes unmounts it with the pod's other volumes, and removeImageVolumes removes
// the views.

// labelImageVolumeOf labels a pod's image volume views, to find them when the pod goes.
const labelImageVolumeOf = "io.skiff.image-volume.pod-uid"

func imageVolumeKey(uid types.UID, volume string) string {
	return fmt.Sprintf("%s-imagevolume-%s", uid, volume)
}

func (r *containerdRuntime) mountImageVolume(ctx context.Context, pod *corev1.Pod, name string, src *corev1.ImageVolumeSource, target string) error {
	if mounted, err := isMountPoint(target); err != nil || mounted {
		return err // mounted once, as the kubelet pulls an image volume once for the pod's life
	}
	img, err := r.ensureImage(ctx, pod, &corev1.Container{Name: "volume/" + name, Image: src.Reference, ImagePullPolicy: src.PullPolicy})
	var outcome *pullOutcome
	if errors.As(err, &outcome) {
		return fmt.Errorf("image %q: %s: %s", src.Reference, outcome.reason, outcome.message)
	} else if err != nil {
		return fmt.Errorf("image %q: %w", src.Reference, err)
	}
	if err := r.unpack(ctx, img); err != nil {
		return err
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return err
	}
	sn := r.client.SnapshotService(snapshotter)
	key := imageVolumeKey(pod.UID, name)
	mounts, err := sn.View(ctx, key, identity.ChainID(diffIDs).String(), snapshots.WithLabels(map[string]string{
		labelImageVolumeOf: string(pod.UID),
		// Held until the pod goes: containerd's garbage collector removes snapshots nothing references.
		"containerd.io/gc.root": time.Now().UTC().Format(time.RFC3339),
	}))
	if errdefs.IsAlreadyExists(err) {
		mounts, err = sn.Mounts(ctx, key)
	}
	if err != nil {
		return fmt.Errorf("image %q: a view of its layers: %w", src.Reference, err)
	}
	if err := mount.All(mounts, target); err != nil {
		return fmt.Errorf("image %q: mounting its layers: %w", src.Reference, err)
	}
	return nil
}

// removeImageVolumes removes the views of a pod's image volumes, once teardownVolumes has unmounted them.
func (r *containerdRuntime) removeImageVolumes(ctx context.Context, uid types.UID) error {
	sn := r.client.SnapshotService(snapshotter)
	var keys []string
	err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		keys = append(keys, info.Name)
		return nil
	}, fmt.Sprintf("labels.%q==%s", labelImageVolumeOf, uid))
	if err != nil {
		return err
	}
	var errs []error
	for _, key := range keys {
		if err := sn.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
