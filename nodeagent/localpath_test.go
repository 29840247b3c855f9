package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/skiff-dev/skiff/config"
)

func TestLocalPathProvisionAndReclaim(t *testing.T) {
	ctx := context.Background()
	retain, del := corev1.PersistentVolumeReclaimRetain, corev1.PersistentVolumeReclaimDelete
	classes := []*storagev1.StorageClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "local-path"}, Provisioner: LocalPathProvisioner, ReclaimPolicy: &del},
		{ObjectMeta: metav1.ObjectMeta{Name: "keep"}, Provisioner: LocalPathProvisioner, ReclaimPolicy: &retain},
		{ObjectMeta: metav1.ObjectMeta{Name: "tuned"}, Provisioner: LocalPathProvisioner, Parameters: map[string]string{"nodePath": "/x"}},
	}
	claim := func(name, class, node string, modes ...corev1.PersistentVolumeAccessMode) *corev1.PersistentVolumeClaim {
		if len(modes) == 0 {
			modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
		}
		return &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Annotations: map[string]string{
				annStorageProvisioner: LocalPathProvisioner, annSelectedNode: node}},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: modes,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		}
	}
	claims := []*corev1.PersistentVolumeClaim{
		claim("mine", "local-path", "node-a"), claim("kept", "keep", "node-a"), claim("elsewhere", "local-path", "node-b"),
		claim("shared", "local-path", "node-a", corev1.ReadWriteMany), claim("tuned", "tuned", "node-a"),
	}
	client := fake.NewClientset()
	for _, c := range classes {
		client.Tracker().Add(c)
	}
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, c := range claims {
		indexer.Add(c)
	}
	recorder := record.NewFakeRecorder(10)
	a := &Agent{cfg: &config.Agent{DataDir: t.TempDir()}, nodes: map[string]bool{"node-a": true}, client: client,
		recorder: recorder, logger: hclog.NewNullLogger()}
	pvIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	volumes := corelisters.NewPersistentVolumeLister(pvIndexer)
	for _, c := range claims {
		if err := a.provision(ctx, indexer, volumes, "default/"+c.Name); err != nil {
			t.Fatalf("provision %s: %v", c.Name, err)
		}
	}
	list, _ := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	got := map[string]corev1.PersistentVolume{}
	for _, pv := range list.Items {
		got[pv.Spec.ClaimRef.Name] = pv
	}
	if len(got) != 2 {
		t.Fatalf("volumes for claims %v, want for mine and kept only (not another node's, RWX or a class with parameters)", keys(got))
	}
	pv := got["mine"]
	dir := filepath.Join(a.cfg.DataDir, "volumes", "pvc-uid-mine")
	if pv.Name != "pvc-uid-mine" || pv.Spec.Local == nil || pv.Spec.Local.Path != dir || !volumePinnedTo(&pv, "node-a") ||
		pv.Spec.PersistentVolumeReclaimPolicy != del || pv.Spec.ClaimRef.UID != "uid-mine" || pv.Spec.StorageClassName != "local-path" ||
		pv.Annotations[annProvisionedBy] != LocalPathProvisioner || pv.Spec.Capacity.Storage().String() != "1Gi" {
		t.Fatalf("volume of mine: %+v", pv)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("directory %s: %v %v", dir, fi, err)
	}
	if got["kept"].Spec.PersistentVolumeReclaimPolicy != retain {
		t.Fatalf("volume of kept: reclaim %s", got["kept"].Spec.PersistentVolumeReclaimPolicy)
	}
	var events []string
	for len(recorder.Events) > 0 {
		events = append(events, <-recorder.Events)
	}
	want := []string{
		"Normal ProvisioningSucceeded Successfully provisioned volume pvc-uid-mine on node node-a",
		"Normal ProvisioningSucceeded Successfully provisioned volume pvc-uid-kept on node node-a",
		"Warning ProvisioningFailed skiff.dev/local-path: access mode ReadWriteMany is not supported: a local-path volume lives on one node (use ReadWriteOnce or ReadWriteOncePod)",
		`Warning ProvisioningFailed skiff.dev/local-path: StorageClass tuned: parameter "nodePath" is not supported by skiff.dev/local-path`,
	}
	if !slices.Equal(events, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(events, "\n"), strings.Join(want, "\n"))
	}

	// Released: a Delete volume loses its directory and itself; a Retain one stays.
	for _, v := range got {
		v.Status.Phase = corev1.VolumeReleased
		pvIndexer.Add(&v)
	}
	for _, v := range got {
		if err := a.reclaim(ctx, volumes, v.Name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory of the released volume: %v", err)
	}
	list, _ = client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if len(list.Items) != 1 || list.Items[0].Name != "pvc-uid-kept" {
		t.Fatalf("volumes left: %v", list.Items)
	}
	if _, err := os.Stat(filepath.Join(a.cfg.DataDir, "volumes", "pvc-uid-kept")); err != nil {
		t.Fatalf("the retained volume's directory: %v", err)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// claimObjects is an objectGetter that also resolves claims to volumes.
type claimObjects struct {
	*fakeObjects
	volumes map[string]*corev1.PersistentVolume // by claim name
}

func (c claimObjects) ClaimVolume(_ context.Context, _, claim string) (*corev1.PersistentVolume, error) {
	if pv, ok := c.volumes[claim]; ok {
		return pv, nil
	}
	return nil, fmt.Errorf("persistentvolumeclaim %q is not bound yet (phase Pending)", claim)
}

// A claim's volume is its local or hostPath directory, mounted as it is (read-only when the claim says so);
// an unbound claim fails the setup, to be retried.
func TestSetupClaimVolumes(t *testing.T) {
	local, host := t.TempDir(), t.TempDir()
	objs := claimObjects{fakeObjects: newFakeObjects(), volumes: map[string]*corev1.PersistentVolume{
		"data": {ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: local}}}},
		"shared": {ObjectMeta: metav1.ObjectMeta{Name: "by-hand"}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: host}}}},
	}}
	claim := func(name, claimName string, readOnly bool) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
			ClaimName: claimName, ReadOnly: readOnly}}}
	}
	pod := testPod(claim("d", "data", false), claim("s", "shared", true))
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "d", MountPath: "/d"}, {Name: "s", MountPath: "/s"}}
	vols, err := setupT(t, pod, t.TempDir(), objs)
	if err != nil {
		t.Fatal(err)
	}
	if vols["d"] != local || vols["s"] != host {
		t.Fatalf("volumes %v, want d=%s s=%s", vols, local, host)
	}
	mounts, err := containerMounts(readOnlyClaimMounts(pod, &pod.Spec.Containers[0]), vols, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		want := map[string]string{"/d": "rw", "/s": "ro"}[m.Destination]
		if !slices.Contains(m.Options, want) {
			t.Errorf("mount %s options %v, want %s", m.Destination, m.Options, want)
		}
	}
	if _, err := setupT(t, testPod(claim("u", "unbound", false)), t.TempDir(), objs); err == nil ||
		!strings.Contains(err.Error(), `persistentvolumeclaim "unbound" is not bound yet`) || errors.Is(err, errNotSupported) {
		t.Fatalf("unbound claim: %v, want a retryable error", err)
	}
}
