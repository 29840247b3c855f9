package apiserver_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestPersistentVolumesAndClaims checks the storage API end to end on one server with its controllers: the
// default class local-path (WaitForFirstConsumer) exists and is given to claims that name none; volumes and
// claims get their protection finalizers and kube's validation; Kubernetes' PersistentVolume controller binds
// a claim without a class to a hand-made volume and releases the volume when the claim goes; and a node may
// create only volumes pinned to itself.
func TestPersistentVolumesAndClaims(t *testing.T) {
	t.Parallel()
	peer := servertest.Shared(t)
	ns := servertest.Namespace(t, peer, "pvs")
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
	defaulted, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim("defaulted", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if defaulted.Spec.StorageClassName == nil || *defaulted.Spec.StorageClassName != "local-path" ||
		!slices.Contains(defaulted.Finalizers, "kubernetes.io/pvc-protection") || *defaulted.Spec.VolumeMode != corev1.PersistentVolumeFilesystem {
		t.Fatalf("claim without a class: class %v, finalizers %v, volumeMode %v", defaulted.Spec.StorageClassName, defaulted.Finalizers, defaulted.Spec.VolumeMode)
	}
	// It waits for its first consumer: the controller leaves it Pending, with no provisioner asked yet.
	time.Sleep(time.Second)
	if cur, _ := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "defaulted", metav1.GetOptions{}); cur.Status.Phase != corev1.ClaimPending ||
		cur.Annotations["volume.kubernetes.io/storage-provisioner"] != "" {
		t.Fatalf("a WaitForFirstConsumer claim without a pod: phase %s, annotations %v", cur.Status.Phase, cur.Annotations)
	}

	// kube's validation, with field paths.
	_, err = c.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: corev1.PersistentVolumeSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/x"}}}}, metav1.CreateOptions{})
	invalidAt(t, "a volume without capacity", err, "spec.capacity")
	_, err = c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "bad"}}, metav1.CreateOptions{})
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
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim("static", &empty), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the claim bound", 30*time.Second, func() error {
		cl, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "static", metav1.GetOptions{})
		if err != nil || cl.Status.Phase != corev1.ClaimBound || cl.Spec.VolumeName != "by-hand" || cl.Status.Capacity.Storage().String() != "5Gi" {
			return fmt.Errorf("claim %v %v", cl.Status, err)
		}
		v, err := c.CoreV1().PersistentVolumes().Get(ctx, "by-hand", metav1.GetOptions{})
		if err != nil || v.Status.Phase != corev1.VolumeBound || v.Spec.ClaimRef == nil || v.Spec.ClaimRef.Name != "static" {
			return fmt.Errorf("volume %v %v", v.Status, err)
		}
		return nil
	})
	if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "static", metav1.DeleteOptions{}); err != nil {
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

// TestCSIObjects: the storage.k8s.io/v1 objects of CSI drivers are served as on kube-apiserver (the
// conformance suite's lifecycles of CSIDriver, CSINode, CSIStorageCapacity, VolumeAttachment and
// VolumeAttributesClass): created, patched, listed as kubectl's tables with kube's own columns, refused with
// a field path when invalid, a VolumeAttachment's status only through its subresource, and deleted.
func TestCSIObjects(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	ns := apiserver.NamespaceOn(t, cfg, "csi")
	c := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	storage := c.StorageV1()
	attach := false
	if _, err := storage.CSIDrivers().Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "csi.example.com"},
		Spec: storagev1.CSIDriverSpec{AttachRequired: &attach}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := storage.CSIDrivers().Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: storagev1.CSIDriverSpec{VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{"Sometimes"}}}, metav1.CreateOptions{}); !apierrors.IsInvalid(err) ||
		!strings.Contains(err.Error(), "spec.volumeLifecycleModes") {
		t.Errorf("a CSIDriver with an unknown lifecycle mode: %v; want 422 naming spec.volumeLifecycleModes", err)
	}
	if _, err := storage.CSINodes().Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: "csi.example.com", NodeID: "a"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	capacity := resource.MustParse("10Gi")
	if _, err := storage.CSIStorageCapacities(ns).Create(ctx, &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Name: "cap", Labels: map[string]string{"set": "a"}},
		StorageClassName: "fast", Capacity: &capacity}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := storage.VolumeAttributesClasses().Create(ctx, &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "gold"},
		DriverName: "csi.example.com", Parameters: map[string]string{"iops": "1000"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A class's parameters are immutable, as in kube.
	if _, err := storage.VolumeAttributesClasses().Patch(ctx, "gold", types.MergePatchType, []byte(`{"parameters":{"iops":"2000"}}`), metav1.PatchOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("changing a VolumeAttributesClass's parameters: %v; want 422", err)
	}
	pv := "pv-1"
	va, err := storage.VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va"},
		Spec:   storagev1.VolumeAttachmentSpec{Attacher: "csi.example.com", NodeName: "node-a", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if va.Status.Attached {
		t.Error("a VolumeAttachment's create set its status")
	}
	va.Status.Attached = true
	if va, err = storage.VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil || !va.Status.Attached {
		t.Fatalf("the status subresource: %v %v", va, err)
	}

	table := func(resource, namespace string) *metav1.Table {
		t.Helper()
		table := &metav1.Table{}
		if err := storage.RESTClient().Get().Namespace(namespace).Resource(resource).
			SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Into(table); err != nil {
			t.Fatal(err)
		}
		return table
	}
	for _, tc := range []struct {
		resource, namespace, columns, row string
	}{
		{"csidrivers", "", "Name,AttachRequired,PodInfoOnMount,StorageCapacity,TokenRequests,RequiresRepublish,Modes,Age", "csi.example.com false false false <unset> false Persistent"},
		{"csinodes", "", "Name,Drivers,Age", "node-a 1"},
		{"csistoragecapacities", ns, "Name,StorageClassName,Capacity", "cap fast 10Gi"},
		{"volumeattachments", "", "Name,Attacher,PV,Node,Attached,Age", "va csi.example.com pv-1 node-a true"},
		{"volumeattributesclasses", "", "Name,DriverName,Age", "gold csi.example.com"},
	} {
		tab := table(tc.resource, tc.namespace)
		var names []string
		for _, col := range tab.ColumnDefinitions {
			names = append(names, col.Name)
		}
		if got := strings.Join(names, ","); got != tc.columns || len(tab.Rows) != 1 {
			t.Errorf("%s: columns %s and %d rows; want %s and 1", tc.resource, got, len(tab.Rows), tc.columns)
			continue
		}
		if got := fmt.Sprintln(tab.Rows[0].Cells...); !strings.HasPrefix(got, tc.row) {
			t.Errorf("%s: row %q; want it to start %q", tc.resource, got, tc.row)
		}
	}

	if err := storage.CSIStorageCapacities(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "set=a"}); err != nil {
		t.Fatal(err)
	}
	for _, del := range []func() error{
		func() error { return storage.CSIDrivers().Delete(ctx, "csi.example.com", metav1.DeleteOptions{}) },
		func() error { return storage.CSINodes().Delete(ctx, "node-a", metav1.DeleteOptions{}) },
		func() error { return storage.VolumeAttachments().Delete(ctx, "va", metav1.DeleteOptions{}) },
		func() error { return storage.VolumeAttributesClasses().Delete(ctx, "gold", metav1.DeleteOptions{}) },
	} {
		if err := del(); err != nil {
			t.Error(err)
		}
	}
}
