/* callbacks.c - fit with Keras's callbacks, in C: the guide's model under
   mixed_float16 on Fashion-MNIST with a CosineDecay learning rate,
   EarlyStopping (restore_best_weights), ModelCheckpoint (the best epoch's
   checkpoint) and a callback of our own, a few lines long: it prints the
   loss scale and the learning rate after each epoch and stops training once
   the validation accuracy reaches a target.

       make && ./build/callbacks --epochs 6

   Flags: --epochs N (6)  --units N (256)  --batch-size N (128)
          --data DIR (/usr/share/datasets/fashion-mnist)  --train-limit N (0 = all)
          --target PERCENT (90: stop at this validation accuracy)
          --checkpoint PATH (build/best.mpc) */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "fashion_mnist.h"

/* The user's callback: its state is whatever the user pointer points to. */
typedef struct target {
    float val_accuracy; /* stop when reached */
    int reached_at;     /* the 1-based epoch, 0 if never */
} target;

static mp_status report_and_stop(void *user, mp_fit_state *s, const mp_logs *logs) {
    target *t = (target *)user;
    printf("  [callback] epoch %d: loss scale %.0f, %llu steps skipped so far, learning rate %.6f\n", s->epoch + 1,
           logs->loss_scale, (unsigned long long)logs->skipped_steps, logs->learning_rate);
    if (logs->val_accuracy >= t->val_accuracy) {
        printf("  [callback] val_accuracy %.4f reached the target %.4f: stopping\n", logs->val_accuracy,
               t->val_accuracy);
        t->reached_at = s->epoch + 1;
        s->stop_training = 1; /* Keras: self.model.stop_training = True */
    }
    return MP_OK;
}

int main(int argc, char **argv) {
    int epochs = 6, units = 256, batch = 128, i;
    size_t train_limit = 0;
    const char *dir = FM_PACKAGE_DIR, *checkpoint = "build/best.mpc";
    target goal = {0.90f, 0};
    mp_early_stopping early;
    mp_model_checkpoint best;
    mp_callback callbacks[3];
    mp_compile_desc cd;
    mp_fit_desc fd;
    mp_logs test;
    mp_model *m;
    fm_data data;
    for (i = 1; i < argc; i += 2) {
        if (strcmp(argv[i], "--epochs") == 0) epochs = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--units") == 0) units = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--batch-size") == 0) batch = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--train-limit") == 0) train_limit = (size_t)flag_long(argc, argv, i, 0);
        else if (strcmp(argv[i], "--target") == 0) goal.val_accuracy = (float)flag_long(argc, argv, i, 0) / 100.0f;
        else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc) dir = argv[i + 1];
        else if (strcmp(argv[i], "--checkpoint") == 0 && i + 1 < argc) checkpoint = argv[i + 1];
        else if (flag_backend(argc, argv, i)) {}
        else {
            fprintf(stderr, "usage: %s [--epochs N] [--units N] [--batch-size N] [--data DIR] [--train-limit N]\n"
                            "       [--target PERCENT] [--checkpoint PATH] [--backend cpu|cuda]\n", argv[0]);
            return 2;
        }
    }
    fm_load(&data, dir, train_limit, 42);

    m = fm_guide_model("mixed_float16", units);
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.optimizer.kind = MP_ADAM;
    /* keras.optimizers.schedules.CosineDecay(1e-3, decay_steps = every step of the run) */
    cd.optimizer.schedule.kind = MP_COSINE_DECAY;
    cd.optimizer.schedule.initial_learning_rate = 1e-3f;
    cd.optimizer.schedule.decay_steps = (uint64_t)epochs * ((data.train.x[0].n * 4 / 5 + (size_t)batch - 1) / (size_t)batch);
    CHECK(mp_model_compile(m, &cd), m);

    memset(&early, 0, sizeof early); /* EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True) */
    early.patience = 2;
    early.restore_best_weights = 1;
    early.verbose = 1;
    memset(&best, 0, sizeof best); /* ModelCheckpoint(path, save_best_only=True, verbose=1) */
    best.filepath = checkpoint;
    best.save_best_only = 1;
    best.verbose = 1;
    callbacks[0] = mp_early_stopping_callback(&early);
    callbacks[1] = mp_model_checkpoint_callback(&best);
    memset(&callbacks[2], 0, sizeof callbacks[2]);
    callbacks[2].on_epoch_end = report_and_stop;
    callbacks[2].user = &goal;

    memset(&fd, 0, sizeof fd);
    fd.data = data.train;
    fd.batch_size = batch;
    fd.epochs = epochs;
    fd.validation_split = 0.2f;
    fd.callbacks = callbacks;
    fd.callback_count = 3;
    CHECK(mp_model_fit(m, &fd), m);

    CHECK(mp_model_evaluate(m, &data.test, 1024, &test), m);
    printf("test accuracy %.4f (weights of epoch %d; best val_loss %.4f saved %d time(s) to %s)%s\n", test.accuracy,
           early.best_epoch + 1, best.best, best.saves, checkpoint,
           goal.reached_at ? ", stopped by the target" : "");
    ex_summary("callbacks", "fit's Keras-style callbacks: CosineDecay, EarlyStopping kept epoch %d's weights, "
               "ModelCheckpoint saved the best %d time(s), one's own callback reported each epoch",
               early.best_epoch + 1, best.saves);
    mp_model_destroy(m);
    fm_free(&data);
    return 0;
}
