package apiserver_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestFlowControlConfiguration: flowcontrol.apiserver.k8s.io/v1 is served with kube-apiserver's bootstrap
// configuration (the mandatory exempt and catch-all objects restored when deleted, the suggested ones
// present), kube's validation with field paths, and status only through /status.
func TestFlowControlConfiguration(t *testing.T) {
	t.Parallel()
	cs := kubernetes.NewForConfigOrDie(apiserver.StartTestAPI(t, apiserver.TestAPIOptions{}))
	ctx := context.Background()
	fc := cs.FlowcontrolV1()

	proctest.WaitFor(t, "the bootstrap configuration", 30*time.Second, func() error {
		for _, name := range []string{"exempt", "catch-all", "system-nodes", "kube-controller-manager", "global-default"} {
			if _, err := fc.FlowSchemas().Get(ctx, name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		for _, name := range []string{"exempt", "catch-all", "system", "workload-high", "global-default"} {
			if _, err := fc.PriorityLevelConfigurations().Get(ctx, name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err := fc.FlowSchemas().Delete(ctx, "catch-all", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the mandatory catch-all FlowSchema restored", 30*time.Second, func() error {
		_, err := fc.FlowSchemas().Get(ctx, "catch-all", metav1.GetOptions{})
		return err
	})

	fs := &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: "mine"},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "global-default"},
			MatchingPrecedence:         20000,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "alice"}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""},
					Resources: []string{"pods"}, Namespaces: []string{"*"}}},
			}},
		},
	}
	_, err := fc.FlowSchemas().Create(ctx, fs, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("matchingPrecedence 20000: %v; want 422", err)
	}
	if causes := err.(apierrors.APIStatus).Status().Details.Causes; len(causes) == 0 || causes[0].Field != "spec.matchingPrecedence" {
		t.Errorf("causes %+v; want spec.matchingPrecedence", causes)
	}
	fs.Spec.MatchingPrecedence = 500
	fs.Status.Conditions = []flowcontrolv1.FlowSchemaCondition{{Type: "Dangling", Status: "True"}}
	created, err := fc.FlowSchemas().Create(ctx, fs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(created.Status.Conditions) != 0 {
		t.Errorf("status set on create: %+v", created.Status)
	}
	// The server's configuration controller writes the Dangling condition too (as kube-apiserver's does), so
	// an update of the created object's resourceVersion may meet a conflict: read again and retry, as a
	// client of kube-apiserver must.
	var updated *flowcontrolv1.FlowSchema
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := fc.FlowSchemas().Get(ctx, "mine", metav1.GetOptions{})
		if err != nil {
			return err
		}
		current.Status.Conditions = []flowcontrolv1.FlowSchemaCondition{{Type: "Dangling", Status: "False",
			Reason: "Found", LastTransitionTime: metav1.Now()}}
		updated, err = fc.FlowSchemas().UpdateStatus(ctx, current, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(updated.Status.Conditions) != 1 || updated.Status.Conditions[0].Reason != "Found" {
		t.Errorf("status after /status: %+v", updated.Status)
	}
	list, err := fc.PriorityLevelConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) < 5 {
		t.Errorf("%d priority levels; want kube-apiserver's bootstrap set", len(list.Items))
	}
	// kube-apiserver's columns.
	if cols, rows := tableColumns(t, fc.RESTClient(), "flowschemas"); cols != "Name,PriorityLevel,MatchingPrecedence,DistinguisherMethod,Age,MissingPL" || rows < 5 {
		t.Errorf("flowschemas table: %s, %d rows", cols, rows)
	}
	if cols, rows := tableColumns(t, fc.RESTClient(), "prioritylevelconfigurations"); cols != "Name,Type,NominalConcurrencyShares,Queues,HandSize,QueueLengthLimit,Age" || rows < 5 {
		t.Errorf("prioritylevelconfigurations table: %s, %d rows", cols, rows)
	}
}

// tableColumns gets resource as a Table, as kubectl get does, and returns its column names joined by commas
// and its number of rows.
func tableColumns(t *testing.T, client rest.Interface, resource string) (string, int) {
	t.Helper()
	table := &metav1.Table{}
	if err := client.Get().Resource(resource).SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
		Do(context.Background()).Into(table); err != nil {
		t.Fatalf("%s as a Table: %v", resource, err)
	}
	var names []string
	for _, col := range table.ColumnDefinitions {
		names = append(names, col.Name)
	}
	return strings.Join(names, ","), len(table.Rows)
}

// TestPriorityAndFairness: requests are classified by the FlowSchemas as kube-apiserver classifies them,
// and say so in the X-Kubernetes-PF-* headers: an admin's (system:masters) by the exempt schema, another
// user's by global-default, a node's by system-nodes; a FlowSchema of a user's own, with a higher precedence,
// takes that user's requests once the server has read it.
func TestPriorityAndFairness(t *testing.T) {
	t.Parallel()
	admin := apiserver.StartTestAPI(t, apiserver.TestAPIOptions{})
	cs := kubernetes.NewForConfigOrDie(admin)
	ctx := context.Background()
	uids := map[string]string{}
	proctest.WaitFor(t, "the bootstrap FlowSchemas", 30*time.Second, func() error {
		for _, name := range []string{"exempt", "global-default", "system-nodes"} {
			fs, err := cs.FlowcontrolV1().FlowSchemas().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			uids[name] = string(fs.UID)
		}
		return nil
	})
	schemaOf := func(user string, groups ...string) string {
		t.Helper()
		cfg := rest.CopyConfig(admin)
		if user != "" {
			cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
		}
		var got string
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := rt.RoundTrip(r)
				if err == nil {
					got = resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID")
				}
				return resp, err
			})
		})
		// Forbidden or not, the request was classified before authorization answered.
		_, _ = kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{})
		return got
	}
	mine := &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: "alice-first"}, Spec: flowcontrolv1.FlowSchemaSpec{
		PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "workload-high"},
		MatchingPrecedence:         500,
		Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
			Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "alice"}}},
			ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"},
				ClusterScope: true, Namespaces: []string{"*"}}},
		}},
	}}
	proctest.WaitFor(t, "requests classified", 30*time.Second, func() error {
		for who, want := range map[string]string{"": "exempt", "alice": "global-default", "system:node:n1": "system-nodes"} {
			var groups []string
			if strings.HasPrefix(who, "system:node:") {
				groups = []string{"system:nodes", "system:authenticated"}
			}
			if got := schemaOf(who, groups...); got != uids[want] {
				return fmt.Errorf("%q classified by FlowSchema UID %q, want %s's %s", who, got, want, uids[want])
			}
		}
		return nil
	})
	created, err := cs.FlowcontrolV1().FlowSchemas().Create(ctx, mine, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "alice's own FlowSchema to apply", 30*time.Second, func() error {
		if got := schemaOf("alice"); got != string(created.UID) {
			return fmt.Errorf("alice classified by %q", got)
		}
		return nil
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
