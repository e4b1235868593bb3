/* With "supervise": true the gateway starts one worker process per
 * configured worker, notices when one exits, fails the requests it was
 * running (that happens through the connection drop too), and starts it
 * again after a backoff that doubles up to restart_backoff_max_ms and
 * resets once a worker has stayed up for a minute. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "gateway/gw.h"

static void spawn(mr_gw *gw, mr_gw_worker *w)
{
    const mr_model_conf *mc = w->model->conf;
    char dev[16], ctx[16], run[16];
    snprintf(dev, sizeof dev, "%d", w->conf->device);
    snprintf(ctx, sizeof ctx, "%u", mc->context_length);
    snprintf(run, sizeof run, "%u", mc->max_running);
    char *argv[32 + MR_MAX_WORKER_ARGS];
    int n = 0;
    argv[n++] = gw->conf.worker_bin;
    argv[n++] = "--listen";
    argv[n++] = (char *)w->conf->url;
    argv[n++] = "--name";
    argv[n++] = (char *)mc->name;
    argv[n++] = "--device";
    argv[n++] = dev;
    argv[n++] = "--backend";
    argv[n++] = (char *)mc->backend;
    argv[n++] = "--ctx";
    argv[n++] = ctx;
    argv[n++] = "--max-running";
    argv[n++] = run;
    if (mc->path[0]) {
        argv[n++] = "--model";
        argv[n++] = (char *)mc->path;
    }
    for (int i = 0; i < mc->n_worker_args; i++)
        argv[n++] = mc->worker_args[i];
    argv[n] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        MR_ERROR("supervisor: fork: %s", strerror(errno));
        w->restart_at = mr_now() + w->backoff_ms / 1000.0;
        return;
    }
    if (pid == 0) {
        /* the worker must not outlive the gateway that supervises it */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        execv(argv[0], argv);
        fprintf(stderr, "supervisor: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    w->pid = pid;
    w->restart_at = 0;
    w->started_at = mr_now();
    MR_INFO("supervisor: started %s worker %d (pid %d)", mc->name, w->index, (int)pid);
}

void mr_sup_start_all(mr_gw *gw)
{
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++) {
            mr_gw_worker *w = &gw->models[m].workers[i];
            w->backoff_ms = gw->conf.backoff_min_ms;
            spawn(gw, w);
        }
}

static mr_gw_worker *by_pid(mr_gw *gw, pid_t pid)
{
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++)
            if (gw->models[m].workers[i].pid == pid)
                return &gw->models[m].workers[i];
    return NULL;
}

void mr_sup_tick(mr_gw *gw)
{
    int status;
    pid_t pid;
    double now = mr_now();
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        mr_gw_worker *w = by_pid(gw, pid);
        if (!w)
            continue;
        w->pid = 0;
        if (WIFSIGNALED(status))
            MR_WARN("supervisor: %s worker %d (pid %d) killed by signal %d", w->model->conf->name, w->index,
                    (int)pid, WTERMSIG(status));
        else
            MR_WARN("supervisor: %s worker %d (pid %d) exited with status %d", w->model->conf->name, w->index,
                    (int)pid, WEXITSTATUS(status));
        mr_gw_fail_worker_jobs(w, "the worker serving this request exited");
        w->ready = false;
        if (gw->draining)
            continue;
        if (now - w->started_at > 60)
            w->backoff_ms = gw->conf.backoff_min_ms;
        w->restart_at = now + w->backoff_ms / 1000.0;
        w->backoff_ms = w->backoff_ms * 2 > gw->conf.backoff_max_ms ? gw->conf.backoff_max_ms : w->backoff_ms * 2;
    }
    if (gw->draining)
        return;
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++) {
            mr_gw_worker *w = &gw->models[m].workers[i];
            if (!w->pid && w->restart_at > 0 && now >= w->restart_at) {
                w->restarts++;
                gw->worker_restarts++;
                spawn(gw, w);
            }
        }
}

bool mr_sup_all_exited(mr_gw *gw)
{
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++)
            if (gw->models[m].workers[i].pid)
                return false;
    return true;
}

void mr_sup_stop_all(mr_gw *gw, int grace_ms)
{
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++)
            if (gw->models[m].workers[i].pid)
                kill(gw->models[m].workers[i].pid, SIGTERM);
    double deadline = mr_now() + grace_ms / 1000.0;
    while (!mr_sup_all_exited(gw)) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            mr_gw_worker *w = by_pid(gw, pid);
            if (w)
                w->pid = 0;
            continue;
        }
        if (mr_now() > deadline) {
            for (int m = 0; m < gw->n_models; m++)
                for (int i = 0; i < gw->models[m].n_workers; i++)
                    if (gw->models[m].workers[i].pid) {
                        MR_WARN("supervisor: worker pid %d ignored SIGTERM; killing",
                                (int)gw->models[m].workers[i].pid);
                        kill(gw->models[m].workers[i].pid, SIGKILL);
                    }
            deadline = mr_now() + 5;
        }
        usleep(20000);
    }
}
