package apiserver_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestPersistentVolumesAndClaims checks the storage API end to end on one server with its controllers: the
// default class local-path (WaitForFirstConsumer) exists and is given to claims that name none; volumes and
// claims get their protection finalizers and kube's validation; Kubernetes' PersistentVolume controller binds
// a claim without a class to a hand-made volume and releases the volume when the claim goes; and a node may
// create only volumes pinned to itself.
func TestPersistentVolumesAndClaims(t *testing.T) {
	peer := servertest.Start(t, 1)[0]
	c := peer.Client
	ctx := context.Background()

	var sc *storagev1.StorageClass
	proctest.WaitFor(t, "the local-path class", 20*time.Second, func() (err error) {
		sc, err = c.StorageV1().StorageClasses().Get(ctx, "local-path", metav1.GetOptions{})
		return err
	})
	if sc.Provisioner != "skiff.dev/local-path" || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer ||
		*sc.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete || sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" {
		t.Fatalf("local-path class: %+v", sc)
	}

	claim := func(name string, class *string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	}
	defaulted, err := c.CoreV1().PersistentVolumeClaims("default").Create(ctx, claim("defaulted", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if defaulted.Spec.StorageClassName == nil || *defaulted.Spec.StorageClassName != "local-path" ||
		!slices.Contains(defaulted.Finalizers, "kubernetes.io/pvc-protection") || *defaulted.Spec.VolumeMode != corev1.PersistentVolumeFilesystem {
		t.Fatalf("claim without a class: class %v, finalizers %v, volumeMode %v", defaulted.Spec.StorageClassName, defaulted.Finalizers, defaulted.Spec.VolumeMode)
	}
	// It waits for its first consumer: the controller leaves it Pending, with no provisioner asked yet.
	time.Sleep(time.Second)
	if cur, _ := c.CoreV1().PersistentVolumeClaims("default").Get(ctx, "defaulted", metav1.GetOptions{}); cur.Status.Phase != corev1.ClaimPending ||
		cur.Annotations["volume.kubernetes.io/storage-provisioner"] != "" {
		t.Fatalf("a WaitForFirstConsumer claim without a pod: phase %s, annotations %v", cur.Status.Phase, cur.Annotations)
	}

	// kube's validation, with field paths.
	_, err = c.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: corev1.PersistentVolumeSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/x"}}}}, metav1.CreateOptions{})
	invalidAt(t, "a volume without capacity", err, "spec.capacity")
	_, err = c.CoreV1().PersistentVolumeClaims("default").Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "bad"}}, metav1.CreateOptions{})
	invalidAt(t, "a claim without access modes", err, "spec.accessModes")

	// A hand-made volume binds to a claim without a class, and is Released when the claim goes.
	pv, err := c.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "by-hand"},
		Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: t.TempDir()}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain || !slices.Contains(pv.Finalizers, "kubernetes.io/pv-protection") {
		t.Fatalf("volume defaults: reclaim %s, finalizers %v", pv.Spec.PersistentVolumeReclaimPolicy, pv.Finalizers)
	}
	empty := ""
	if _, err := c.CoreV1().PersistentVolumeClaims("default").Create(ctx, claim("static", &empty), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the claim bound", 30*time.Second, func() error {
		cl, err := c.CoreV1().PersistentVolumeClaims("default").Get(ctx, "static", metav1.GetOptions{})
		if err != nil || cl.Status.Phase != corev1.ClaimBound || cl.Spec.VolumeName != "by-hand" || cl.Status.Capacity.Storage().String() != "5Gi" {
			return fmt.Errorf("claim %v %v", cl.Status, err)
		}
		v, err := c.CoreV1().PersistentVolumes().Get(ctx, "by-hand", metav1.GetOptions{})
		if err != nil || v.Status.Phase != corev1.VolumeBound || v.Spec.ClaimRef == nil || v.Spec.ClaimRef.Name != "static" {
			return fmt.Errorf("volume %v %v", v.Status, err)
		}
		return nil
	})
	if err := c.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "static", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the volume Released", 30*time.Second, func() error {
		v, err := c.CoreV1().PersistentVolumes().Get(ctx, "by-hand", metav1.GetOptions{})
		if err != nil || v.Status.Phase != corev1.VolumeReleased {
			return fmt.Errorf("volume %v %v", v.Status, err)
		}
		return nil
	})

	// A node creates and deletes only volumes pinned to itself.
	nodeConfig := rest.AnonymousClientConfig(peer.Config)
	nodeConfig.CertFile = servertest.NodeClientCert(t, peer, "node-1")
	nodeConfig.KeyFile = nodeConfig.CertFile
	node, err := kubernetes.NewForConfig(nodeConfig)
	if err != nil {
		t.Fatal(err)
	}
	local := func(name, on string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/var/lib/x/" + name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{on}}}}}}}}}
	}
	if _, err := node.CoreV1().PersistentVolumes().Create(ctx, local("theirs", "node-2"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("node-1 creating a volume on node-2: %v, want 403", err)
	}
	if _, err := node.CoreV1().PersistentVolumes().Create(ctx, local("mine", "node-1"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("node-1 creating a volume on itself: %v", err)
	}
	if err := node.CoreV1().PersistentVolumes().Delete(ctx, "by-hand", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("node-1 deleting a volume not pinned to it: %v, want 403", err)
	}
	// (Admission reads the volume from the server's informer, which may not have it yet: 404, retried.)
	proctest.WaitFor(t, "node-1 deleting its own volume", 10*time.Second, func() error {
		return node.CoreV1().PersistentVolumes().Delete(ctx, "mine", metav1.DeleteOptions{})
	})
}
